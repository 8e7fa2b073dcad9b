"""The offline difficulty filter: each training prompt's pass rate over K samples of a
reference model, and the prompt set whose pass rate lies in a band (INTELLECT-2 kept
about 0.1-0.8 of 8 samples), written as a problem file that the task reads back.

Design choices:
- A prompt's pass rate is the share of its K samples whose task reward is 1.0 (the
  verifier's "correct"). The length penalty plays no part: the filter judges how hard
  a prompt is, not how long the answers are.
- The band is inclusive at both ends. Pass rates over K samples are multiples of 1/K,
  so with K = 8 the paper's band [0.1, 0.8] keeps the prompts solved 1 to 6 times.
- The samples come from the run's own sampling and scoring (`generate_rollouts`, the
  worker's path) at the run's sampling settings, each prompt with one target length
  drawn from `task.target_lengths` as the run draws them, so a pass rate is measured on
  the prompts the workers will see. Sampling seeds come from (seed, problem id, sample
  number), so a prompt's pass rate does not depend on the batch it was sampled in.
- Only the training split is sampled; the held-out split is never read, so an
  evaluation problem can neither enter the filtered set nor steer which prompts do.
- The prompts considered are all training problems, or with a limit a seeded random
  choice of that many, in the task's order.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarmrl.assignment import Assignment, stable_hash
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.tasks.base import Problem, Task

# Sequences per call of the sampler: enough to batch the model's products well on a CPU.
BATCH_SEQUENCES = 256
SUFFIXES = (".jsonl", ".parquet")
# Pass rates are k/K; a band end typed as a rounded decimal (0.333 for 1/3) still keeps k/K.
_RATE_SLACK = 1e-9


@dataclass(frozen=True)
class PassRate:
    """One prompt's result: `passes` of its `samples` completions were verified correct."""

    index: int  # the prompt's training index in the task it was measured on
    problem: Problem
    passes: int
    samples: int

    @property
    def rate(self) -> float:
        return self.passes / self.samples


def check_band(low: float, high: float) -> None:
    """Raise ValueError unless 0 <= low <= high <= 1."""
    if not (0.0 <= low <= 1.0 and 0.0 <= high <= 1.0):
        raise ValueError(f"--band {low} {high}: both ends must lie in [0, 1] (pass rates)")
    if low > high:
        raise ValueError(f"--band {low} {high}: the low end is above the high end")


def count_passes(task_rewards: Sequence[float]) -> int:
    """How many task rewards say "verified correct" (1.0)."""
    return sum(1 for reward in task_rewards if reward >= 1.0)


def in_band(passes: int, samples: int, low: float, high: float) -> bool:
    """Whether a pass rate of passes/samples lies in [low, high] (both ends included)."""
    if samples < 1 or not 0 <= passes <= samples:
        raise ValueError(f"{passes} passes of {samples} samples is not a pass rate")
    rate = passes / samples
    return low - _RATE_SLACK <= rate <= high + _RATE_SLACK


def kept_pass_counts(samples: int, low: float, high: float) -> list[int]:
    """The numbers of passes out of `samples` that the band keeps (e.g. 8, [0.1, 0.8]: 1-6)."""
    check_band(low, high)
    return [k for k in range(samples + 1) if in_band(k, samples, low, high)]


def keep_band(results: Sequence[PassRate], low: float, high: float) -> list[PassRate]:
    """The results whose pass rate lies in the band, in their order."""
    check_band(low, high)
    return [r for r in results if in_band(r.passes, r.samples, low, high)]


def pass_histogram(results: Sequence[PassRate], samples: int) -> list[int]:
    """How many prompts were solved 0, 1, ..., `samples` times."""
    counts = [0] * (samples + 1)
    for result in results:
        counts[result.passes] += 1
    return counts


def choose_prompts(num_train: int, limit: int | None, seed: int) -> list[int]:
    """The training indices to consider: all, or a seeded random `limit` of them, sorted."""
    if limit is None or limit >= num_train:
        return list(range(num_train))
    if limit < 1:
        raise ValueError(f"--limit {limit}: consider at least one prompt")
    rng = np.random.default_rng(stable_hash(f"swarmrl-filter-prompts|{seed}"))
    return sorted(int(i) for i in rng.choice(num_train, size=limit, replace=False))


def filter_assignment(
    task: Task, indices: Sequence[int], samples: int, target_lengths: Sequence[int], seed: int
) -> Assignment:
    """The prompts, target lengths and sampling seeds of one batch of the filter."""
    targets, seeds = [], []
    for index in indices:
        problem_id = task.train_problem(index).problem_id
        key = f"{seed}|{problem_id}"
        targets.append(
            int(target_lengths[stable_hash("swarmrl-filter-target|" + key) % len(target_lengths)])
            if target_lengths
            else -1
        )
        seeds.append([stable_hash(f"swarmrl-filter|{key}|{k}") >> 1 for k in range(samples)])
    return Assignment(
        seed=seed, problem_indices=list(indices), target_lengths=targets, sample_seeds=seeds
    )


def measure_pass_rates(
    model,
    tokenizer,
    task: Task,
    indices: Sequence[int],
    *,
    samples: int,
    params: SamplingParams,
    target_lengths: Sequence[int],
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[PassRate]:
    """Sample `samples` completions of each training prompt in `indices` and count the
    verified ones; `progress(done, total)` is called after each batch of prompts."""
    if samples < 1:
        raise ValueError(f"--samples {samples}: sample each prompt at least once")
    per_batch = max(1, BATCH_SEQUENCES // samples)
    results: list[PassRate] = []
    for start in range(0, len(indices), per_batch):
        chunk = list(indices[start : start + per_batch])
        assignment = filter_assignment(task, chunk, samples, target_lengths, seed)
        # The length coefficient is 0: only the task rewards are read.
        batch = generate_rollouts(
            model,
            tokenizer,
            task,
            assignment,
            params,
            policy_step=0,
            length_alpha=0.0,
            capture_hidden=False,
            proofs=False,
        )
        rewards = batch.columns["task_rewards"]
        for p, index in enumerate(chunk):
            passes = count_passes(rewards[p * samples : (p + 1) * samples])
            results.append(PassRate(index, task.train_problem(index), passes, samples))
        if progress is not None:
            progress(len(results), len(indices))
    return results


def problem_row(task: Task, problem: Problem) -> dict[str, object]:
    """A problem as a row of its task's problem file (docs/tasks.md)."""
    if task.name == "arithmetic":
        a, b = (int(x) for x in problem.question.split("+"))
        return {"id": problem.problem_id, "a": a, "b": b}
    if task.name == "math":
        return {"id": problem.problem_id, "question": problem.question, "answer": problem.answer}
    if task.name == "code":
        return {"id": problem.problem_id, "question": problem.question, "tests": problem.answer}
    raise ValueError(f"the filter cannot write problems of task {task.name!r}")


def pass_rate_row(task: Task, result: PassRate) -> dict[str, object]:
    """A kept prompt's row: its problem, then its pass rate and the counts behind it."""
    return problem_row(task, result.problem) | {
        "pass_rate": result.rate,
        "passes": result.passes,
        "samples": result.samples,
    }


def write_problem_file(path: Path, rows: Sequence[dict[str, object]]) -> None:
    """Write rows as JSONL or Parquet (by the extension), atomically: a reader sees the
    old file or the whole new one."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{path}: the output must end in {' or '.join(SUFFIXES)}")
    if not rows:
        raise ValueError(f"{path}: no problems to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if suffix == ".jsonl":
            with tmp.open("w") as file:
                for row in rows:
                    file.write(json.dumps(row) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def mean_rate(results: Sequence[PassRate]) -> float:
    """The mean pass rate of the results (NaN when there are none)."""
    return float(np.mean([r.rate for r in results])) if results else math.nan
