"""Collect a training batch for step n from rollout files, in the order they are handed in.

Online filtering, the async bound and the trust boundary live here:
- every file goes through the strict reader (``rollouts.read_rollouts``) with the run's
  bounds (samples per file, completion length, vocabulary); a file it refuses, one for
  another step, or one the caller's `rescore` refuses, is rejected (logged with the file
  and the problem, never retried) before anything of it enters a batch, and the trainer
  keeps going;
- `rescore` (the pool source's: trainer/rescoring.py) replaces the file's rewards and
  advantages by the trainer's own recomputation before any filter looks at them;
- a sample counts once, whatever file carries it: a file with the bytes of one already
  read, and a sample of an (assignment, index) already read, are dropped as duplicates;
- samples whose `policy_step` is older than n - async_level, or newer than n (a policy
  that did not exist yet), are dropped;
- groups whose samples all got the same reward (zero advantage) are dropped;
- whole groups are taken, in file-arrival order, until `batch_samples` are collected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from swarmrl.rewards import has_signal
from swarmrl.rollouts import (
    LOOSE_BOUNDS,
    AssignmentKey,
    RolloutBounds,
    RolloutFileError,
    RolloutMeta,
    Rollouts,
    SampleKey,
    SeenFiles,
    file_hash,
    read_rollouts,
)

log = logging.getLogger("swarmrl.trainer")


@dataclass(frozen=True)
class Sample:
    """One row of a rollout file, as the trainer uses it."""

    rows: Rollouts
    index: int

    @property
    def input_tokens(self) -> list[int]:
        return self.rows.input_tokens[self.index]

    @property
    def output_tokens(self) -> list[int]:
        return self.rows.output_tokens[self.index]

    @property
    def output_logprobs(self) -> list[float]:
        """The worker's sampling logprobs: claims, bounded by the off-policy weights."""
        return self.rows.output_logprobs[self.index]

    @property
    def advantage(self) -> float:
        return self.rows.advantages[self.index]

    @property
    def reward(self) -> float:
        return self.rows.rewards[self.index]

    @property
    def policy_step(self) -> int:
        return self.rows.policy_step[self.index]


def token_samples(
    prompts: list[list[int]], completions: list[list[int]], advantages: list[float]
) -> list[Sample]:
    """Samples made from token ids alone, not read from a file (benchmarks and tests of
    the update): zero rewards, no target length, policy step 0, no proofs."""
    n = len(prompts)
    rows = Rollouts(
        problem_id=[str(i) for i in range(n)],
        input_tokens=prompts,
        output_tokens=completions,
        output_logprobs=[[0.0] * len(c) for c in completions],
        rewards=[0.0] * n,
        task_rewards=[0.0] * n,
        length_penalties=[0.0] * n,
        advantages=list(advantages),
        target_lengths=[-1] * n,
        policy_step=[0] * n,
        seed=list(range(n)),
        proofs=[b""] * n,
    )
    return [Sample(rows, i) for i in range(n)]


Rescore = Callable[[Path, Rollouts, RolloutMeta], Rollouts]


def step_is_full(usable: int, read: int, batch_samples: int, max_read_ratio: float) -> bool:
    """A step has what it trains on: a full batch of usable samples, or (`max_read_ratio`
    > 0) some usable ones after reading max_read_ratio × batch_samples samples. The
    orchestrator issues a step no more than that (orchestrator/issuance.py)."""
    if usable >= batch_samples:
        return True
    return max_read_ratio > 0 and usable > 0 and read >= max_read_ratio * batch_samples


@dataclass
class BatchCollector:
    """Accumulates usable groups for one step across calls, reading each file once."""

    step: int
    async_level: int
    bounds: RolloutBounds = LOOSE_BOUNDS
    seen: set[str] = field(default_factory=set)
    groups: list[list[Sample]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    dropped_stale: int = 0
    dropped_zero: int = 0
    dropped_duplicate: int = 0
    counted: SeenFiles = field(default_factory=SeenFiles)
    counted_samples: set[SampleKey] = field(default_factory=set)
    # Every sample read for this step, usable or not: what the policy actually scored.
    all_rewards: list[float] = field(default_factory=list)
    all_task_rewards: list[float] = field(default_factory=list)
    all_length_penalties: list[float] = field(default_factory=list)
    all_length_errors: list[float] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return sum(len(g) for g in self.groups)

    def add_file(self, path: Path, name: str | None = None, rescore: Rescore | None = None) -> bool:
        """Read one file (once per `name`, default its file name); False if it was
        rejected or a duplicate, True if its samples were taken in (usable or not)."""
        path = Path(path)
        name = name or path.name
        if name in self.seen:
            return False
        self.seen.add(name)
        try:
            digest = file_hash(path)
            table, meta = read_rollouts(path, self.bounds)
            if meta.step != self.step:
                raise RolloutFileError(
                    path, f"file is for step {meta.step}, collected for step {self.step}"
                )
            rows = Rollouts.from_table(table)
            if rescore is not None:
                rows = rescore(path, rows, meta)
        except (OSError, RolloutFileError) as exc:
            problem = exc.problem if isinstance(exc, RolloutFileError) else str(exc)
            self.rejected.append((str(path), problem))
            log.error("rejected rollout file %s: %s", path, problem)
            return False
        key = AssignmentKey.of(meta)
        if digest in self.counted.by_hash:
            self.dropped_duplicate += table.num_rows
            log.warning("%s: %s", path, self.counted.duplicate_reason(digest, key))
            return False
        self.counted.add(name, digest, key)
        self._add(rows, key)
        return True

    def _add(self, rows: Rollouts, key: AssignmentKey) -> None:
        n = len(rows)
        self.all_rewards.extend(rows.rewards)
        self.all_task_rewards.extend(rows.task_rewards)
        self.all_length_penalties.extend(rows.length_penalties)
        self.all_length_errors.extend(
            abs(t - len(o))
            for t, o in zip(rows.target_lengths, rows.output_tokens, strict=True)
            if t >= 0
        )
        start = 0
        while start < n:
            end = start
            while end < n and rows.problem_id[end] == rows.problem_id[start]:
                end += 1
            group = [Sample(rows, i) for i in range(start, end)]
            keys = [SampleKey(key, i) for i in range(start, end)]
            start = end
            if any(k in self.counted_samples for k in keys):
                self.dropped_duplicate += len(group)
                continue
            self.counted_samples.update(keys)
            fresh = [s for s in group if self.step - self.async_level <= s.policy_step <= self.step]
            self.dropped_stale += len(group) - len(fresh)
            if len(fresh) != len(group):
                continue
            if not has_signal(np.array([s.reward for s in group])):
                self.dropped_zero += len(group)
                continue
            self.groups.append(group)

    def take(self, batch_samples: int) -> list[Sample]:
        """Whole groups, oldest first, until at least `batch_samples` samples."""
        out: list[Sample] = []
        for group in self.groups:
            if len(out) >= batch_samples:
                break
            out.extend(group)
        return out
