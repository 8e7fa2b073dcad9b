"""The trainer's own rewards and advantages for a worker's file: a worker's numbers are
never trained on.

For each file the trainer rebuilds the assignment's prompts from its seed (the one the
orchestrator issued), refuses a file whose rows are not those prompts, re-runs the
task's verifier on every decoded completion, and recomputes the length penalty (the
run's `task.length_alpha`), the total reward and the group advantages. The file's rows
are then replaced by these values; where the file claimed other values, the file is
logged and counted (`StepMetrics.recomputed_mismatch_files`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from swarmrl.config import RunConfig
from swarmrl.rewards import (
    DEFAULT_SHAPING,
    AdvantageMode,
    LengthShaping,
    length_penalty,
    shaped_advantages,
)
from swarmrl.rollouts import RolloutFileError, RolloutMeta, Rollouts
from swarmrl.scoring import check_assignment, check_values, completion_text, expected_prompts
from swarmrl.tasks.base import Task

log = logging.getLogger("swarmrl.trainer")

# Stored float32 values against float64 recomputation: what rounding alone can explain.
VALUE_TOLERANCE = 1e-5


def recompute_values(
    task_rewards: list[float],
    target_lengths: list[int],
    completion_lengths: list[int],
    *,
    alpha: float,
    group_size: int,
    shaping: LengthShaping = DEFAULT_SHAPING,
    advantage_mode: AdvantageMode = "joint",
) -> tuple[list[float], list[float], list[float]]:
    """Length penalties, total rewards and group advantages from verified task rewards;
    groups are `group_size` consecutive samples."""
    penalties = [
        length_penalty(t, n, alpha, task_reward=r, shaping=shaping)
        for r, t, n in zip(task_rewards, target_lengths, completion_lengths, strict=True)
    ]
    totals = [r - p for r, p in zip(task_rewards, penalties, strict=True)]
    if len(totals) % group_size:
        raise ValueError(f"{len(totals)} samples do not fill groups of {group_size}")
    advantages: list[float] = []
    for g in range(0, len(totals), group_size):
        group = slice(g, g + group_size)
        advantages.extend(
            float(a)
            for a in shaped_advantages(task_rewards[group], penalties[group], advantage_mode)
        )
    return penalties, totals, advantages


@dataclass
class Rescorer:
    """Recomputes a file's values; `mismatched` lists the files whose claims differed."""

    cfg: RunConfig
    task: Task
    tokenizer: Any  # a Hugging Face tokenizer
    seeds: dict[str, int] = field(default_factory=dict)  # file name → assignment seed
    mismatched: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, path: Path, rows: Rollouts, meta: RolloutMeta) -> Rollouts:
        seed = self.seeds.get(path.name)
        if seed is None:
            raise RolloutFileError(path, "no assignment seed known for this file")
        expected, problems = expected_prompts(self.cfg, seed, self.task, self.tokenizer)
        assigned = check_assignment(rows, expected)
        if not assigned.passed:
            first = assigned.failures[0]
            where = f"sample {first.sample}" if first.sample is not None else "file"
            raise RolloutFileError(path, f"not the assigned prompts: {where}: {first.detail}")
        eos_id = self.tokenizer.eos_token_id
        task_rewards = [
            float(self.task.score(problems[pid], completion_text(self.tokenizer, out, eos_id)))
            for pid, out in zip(rows.problem_id, rows.output_tokens, strict=True)
        ]
        group_size = self.cfg.sampling.group_size
        claimed = check_values(
            rows,
            task_rewards,
            alpha=self.cfg.task.alpha_at(meta.step),
            shaping=self.cfg.task.length_shaping,
            advantage_mode=self.cfg.task.advantage_mode,
            group_size=group_size,
            tolerance=VALUE_TOLERANCE,
        )
        if not claimed.passed:
            first = claimed.failures[0]
            problem = f"sample {first.sample}: {first.detail}"
            self.mismatched.append((str(path), problem))
            log.warning(
                "%s: the worker's values differ from the trainer's (%d samples; first: %s); "
                "training with the recomputed ones",
                path.name,
                len(claimed.failures),
                problem,
            )
        penalties, totals, advantages = recompute_values(
            task_rewards,
            rows.target_lengths,
            [len(o) for o in rows.output_tokens],
            alpha=self.cfg.task.alpha_at(meta.step),
            group_size=group_size,
            shaping=self.cfg.task.length_shaping,
            advantage_mode=self.cfg.task.advantage_mode,
        )
        as32 = lambda xs: np.asarray(xs, dtype=np.float32).tolist()  # noqa: E731 (the file's precision)
        return rows.replace(
            task_rewards=as32(task_rewards),
            length_penalties=as32(penalties),
            rewards=as32(totals),
            advantages=as32(advantages),
        )
