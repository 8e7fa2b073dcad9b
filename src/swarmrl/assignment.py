"""Deterministic prompt assignment (docs/architecture.md §2).

Which prompts a worker answers, with which target lengths and sampling seeds, follows
from one seed. In the pool the orchestrator issues it with each assignment (derived from
its secret and the assignment id), so a worker cannot choose or grind easy prompts, and
the validator and the trainer recompute the exact list from the same seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Assignment:
    """The prompts of one work submission."""

    seed: int
    problem_indices: list[int]
    target_lengths: list[int]  # -1 where the task has no length target
    sample_seeds: list[list[int]]  # [prompt][sample]


def stable_hash(text: str) -> int:
    """A 64-bit integer from text, the same in every process and on every machine
    (unlike Python's salted `hash`)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def assignment_seed(run_seed: int, worker_address: str, step: int, counter: int) -> int:
    return stable_hash(f"swarmrl-assignment|{run_seed}|{worker_address}|{step}|{counter}")


def assign(
    run_seed: int,
    worker_address: str,
    step: int,
    counter: int,
    *,
    num_problems: int,
    prompts: int,
    group_size: int,
    target_lengths: list[int],
) -> Assignment:
    """The assignment for (run seed, worker address, step, counter): the derivation of
    the shared-folder era, kept for the tests and benchmarks that build files offline."""
    return assign_from_seed(
        assignment_seed(run_seed, worker_address, step, counter),
        num_problems=num_problems,
        prompts=prompts,
        group_size=group_size,
        target_lengths=target_lengths,
    )


def assign_from_seed(
    seed: int,
    *,
    num_problems: int,
    prompts: int,
    group_size: int,
    target_lengths: list[int],
) -> Assignment:
    """The prompts of the assignment with this seed; pure, so every party computes the same."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, num_problems, size=prompts).tolist()
    targets = (
        rng.choice(target_lengths, size=prompts).tolist() if target_lengths else [-1] * prompts
    )
    sample_seeds = rng.integers(0, 2**63 - 1, size=(prompts, group_size), dtype=np.int64).tolist()
    return Assignment(
        seed=seed,
        problem_indices=indices,
        target_lengths=[int(t) for t in targets],
        sample_seeds=sample_seeds,
    )
