"""Held-out evaluation: pass@1 and length error of a checkpoint on the task's eval split.

One sample per held-out problem at `eval_temperature` (0.6 by default, whatever the
training samples at), with fixed per-problem seeds and a fixed per-problem target
length, so two checkpoints are compared on exactly the same prompts and randomness.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from swarmrl.assignment import stable_hash
from swarmrl.checkpoints import load_policy
from swarmrl.config import RunConfig
from swarmrl.generation.sampler import SamplingParams, sample
from swarmrl.scoring import completion_text, prompt_ids
from swarmrl.tasks.base import Task


class Evaluation(BaseModel):
    """A checkpoint's held-out figures: what `swarmrl eval` prints and `summary.json` keeps."""

    model_config = ConfigDict(frozen=True)

    accuracy: float = Field(description="pass@1: share of held-out problems solved")
    length_error: float | None = Field(
        description="mean |target - length| in tokens (None when the task has no targets)"
    )
    mean_length: float = Field(description="mean completion length in tokens")
    problems: int = Field(description="held-out problems evaluated")


def evaluate(
    model_dir: Path,
    task: Task,
    cfg: RunConfig,
    batch_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> Evaluation:
    """pass@1 and length error; `progress(done, total)` is called after each batch."""
    model, tok = load_policy(model_dir)
    problems = task.eval_problems()
    targets = cfg.task.target_lengths
    params = SamplingParams(
        temperature=cfg.eval_temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    correct, errors, lengths = [], [], []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        chunk_targets = [
            targets[stable_hash("target|" + p.problem_id) % len(targets)] if targets else None
            for p in chunk
        ]
        prompts = [prompt_ids(tok, task, p, t) for p, t in zip(chunk, chunk_targets, strict=True)]
        seeds = [stable_hash("eval|" + p.problem_id) >> 1 for p in chunk]
        gens = sample(model, prompts, seeds, params, pad_id=tok.pad_token_id, capture_hidden=False)
        for problem, target, gen in zip(chunk, chunk_targets, gens, strict=True):
            correct.append(task.score(problem, completion_text(tok, gen.tokens, tok.eos_token_id)))
            lengths.append(len(gen.tokens))
            if target is not None:
                errors.append(abs(target - len(gen.tokens)))
        if progress is not None:
            progress(len(correct), len(problems))
    return Evaluation(
        accuracy=float(np.mean(correct)),
        length_error=float(np.mean(errors)) if errors else None,
        mean_length=float(np.mean(lengths)),
        problems=len(problems),
    )
