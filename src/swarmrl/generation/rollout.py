"""Turn one assignment into scored, grouped samples: generate, reward, advantages.

Pure apart from running the model: given a policy, a task and an assignment it returns
the rollout file's columns. The worker process (`worker.py`) does the I/O around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from swarmrl.assignment import Assignment
from swarmrl.generation.sampler import Generation, SamplingParams, sample
from swarmrl.rewards import (
    DEFAULT_SHAPING,
    AdvantageMode,
    LengthShaping,
    has_signal,
    score_sample,
    shaped_advantages,
)
from swarmrl.rollouts import empty_columns
from swarmrl.scoring import completion_text, prompt_ids
from swarmrl.tasks.base import Task
from swarmrl.toploc import proof_column

# ``sampler.sample``'s signature: (model, prompts, seeds, params, pad_id=, capture_hidden=).
Sampler = Callable[..., list[Generation]]


@dataclass
class RolloutBatch:
    columns: dict[str, list]
    generations: list[Generation]
    num_nonzero: int
    gen_seconds: float
    gen_tokens: int
    proof_seconds: float


def generate_rollouts(
    model,
    tokenizer,
    task: Task,
    assignment: Assignment,
    params: SamplingParams,
    policy_step: int,
    length_alpha: float,
    capture_hidden: bool = True,
    length_shaping: LengthShaping = DEFAULT_SHAPING,
    advantage_mode: AdvantageMode = "joint",
    proofs: bool = True,
    sampler: Sampler = sample,
) -> RolloutBatch:
    """Generate G samples for every assigned prompt and score them.

    With ``proofs=False`` the ``proofs`` column is left empty and the hidden states stay
    in ``generations``: the caller builds the proofs later with ``attach_proofs`` (the
    worker does so in a background thread while it generates the next file).
    ``sampler``: what draws the samples, ``sampler.sample`` or an engine's
    (``vllm_engine.VllmEngine.sample``), both with the same seeded draw.
    """
    problems = [task.train_problem(i) for i in assignment.problem_indices]
    prompts, seeds, owners = [], [], []
    for p_idx, (problem, target) in enumerate(
        zip(problems, assignment.target_lengths, strict=True)
    ):
        ids = prompt_ids(tokenizer, task, problem, target)
        for s in assignment.sample_seeds[p_idx]:
            prompts.append(ids)
            seeds.append(s)
            owners.append(p_idx)
    start = time.perf_counter()
    gens = sampler(
        model, prompts, seeds, params, pad_id=tokenizer.pad_token_id, capture_hidden=capture_hidden
    )
    gen_seconds = time.perf_counter() - start

    cols = empty_columns()
    rewards = []
    for gen, p_idx, prompt, seed in zip(gens, owners, prompts, seeds, strict=True):
        problem, target = problems[p_idx], assignment.target_lengths[p_idx]
        text = completion_text(tokenizer, gen.tokens, params.eos_token_id)
        reward = score_sample(
            task.score(problem, text), target, len(gen.tokens), length_alpha, length_shaping
        )
        rewards.append(reward.total)
        cols["problem_id"].append(problem.problem_id)
        cols["input_tokens"].append(prompt)
        cols["output_tokens"].append(gen.tokens)
        cols["output_logprobs"].append(gen.logprobs.tolist())
        cols["rewards"].append(reward.total)
        cols["task_rewards"].append(reward.task_reward)
        cols["length_penalties"].append(reward.length_penalty)
        cols["target_lengths"].append(target)
        cols["policy_step"].append(policy_step)
        cols["seed"].append(int(seed))
        cols["proofs"].append(b"")
    group = len(assignment.sample_seeds[0])
    num_nonzero = 0
    for start_row in range(0, len(rewards), group):
        chunk = rewards[start_row : start_row + group]
        rows = slice(start_row, start_row + group)
        advantages = shaped_advantages(
            cols["task_rewards"][rows], cols["length_penalties"][rows], advantage_mode
        )
        cols["advantages"].extend(advantages.tolist())
        num_nonzero += group if has_signal(chunk) else 0
    batch = RolloutBatch(
        columns=cols,
        generations=gens,
        num_nonzero=num_nonzero,
        gen_seconds=gen_seconds,
        gen_tokens=sum(len(g.tokens) for g in gens),
        proof_seconds=0.0,
    )
    if proofs and capture_hidden:
        attach_proofs(batch)
    return batch


def attach_proofs(batch: RolloutBatch) -> None:
    """Fill the batch's ``proofs`` column from its generations' hidden states, in place."""
    start = time.perf_counter()
    states = [g.hidden for g in batch.generations if g.hidden is not None]
    if len(states) != len(batch.generations):
        raise ValueError("attach_proofs needs generations sampled with capture_hidden=True")
    batch.columns["proofs"] = proof_column(states)
    batch.proof_seconds = time.perf_counter() - start
