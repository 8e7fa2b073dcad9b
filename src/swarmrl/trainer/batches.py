"""Collect a training batch for step n from the rollout files in `rollouts/step_<n>/`.

Online filtering and the async bound live here:
- a file that is unreadable or breaks the schema is rejected (logged with the file and
  the problem, never retried) and the trainer keeps going;
- samples whose `policy_step` is older than n - async_level, or newer than n (a policy
  that did not exist yet), are dropped;
- groups whose samples all got the same reward (zero advantage) are dropped;
- whole groups are taken, in file-arrival order, until `batch_samples` are collected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from swarmrl.rewards import has_signal
from swarmrl.rollouts import RolloutFileError, read_rollouts

log = logging.getLogger("swarmrl.trainer")


@dataclass
class Sample:
    input_tokens: list[int]
    output_tokens: list[int]
    advantage: float
    reward: float
    task_reward: float
    length_penalty: float
    target_length: int
    policy_step: int


@dataclass
class BatchCollector:
    """Accumulates usable groups for one step across calls, reading each file once."""

    folder: Path
    step: int
    async_level: int
    seen: set[str] = field(default_factory=set)
    groups: list[list[Sample]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    dropped_stale: int = 0
    dropped_zero: int = 0
    # Every sample read for this step, usable or not: what the policy actually scored.
    all_rewards: list[float] = field(default_factory=list)
    all_task_rewards: list[float] = field(default_factory=list)
    all_length_penalties: list[float] = field(default_factory=list)
    all_length_errors: list[float] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return sum(len(g) for g in self.groups)

    def poll(self) -> None:
        """Read every new complete file in the step folder."""
        if not self.folder.is_dir():
            return
        files = sorted(self.folder.glob("*.parquet"), key=lambda p: (p.stat().st_mtime_ns, p.name))
        for path in files:
            if path.name in self.seen:
                continue
            self.seen.add(path.name)
            try:
                table, meta = read_rollouts(path)
                if meta.step != self.step:
                    raise RolloutFileError(
                        path,
                        f"file is for step {meta.step}, found in the folder of step {self.step}",
                    )
            except RolloutFileError as exc:
                self.rejected.append((str(path), exc.problem))
                log.error("rejected rollout file %s", exc)
                continue
            self._add(table.to_pydict())

    def _add(self, rows: dict[str, list]) -> None:
        n = len(rows["problem_id"])
        self.all_rewards.extend(rows["rewards"])
        self.all_task_rewards.extend(rows["task_rewards"])
        self.all_length_penalties.extend(rows["length_penalties"])
        self.all_length_errors.extend(
            abs(t - len(o))
            for t, o in zip(rows["target_lengths"], rows["output_tokens"], strict=True)
            if t >= 0
        )
        start = 0
        while start < n:
            end = start
            while end < n and rows["problem_id"][end] == rows["problem_id"][start]:
                end += 1
            group = [
                Sample(
                    rows["input_tokens"][i],
                    rows["output_tokens"][i],
                    rows["advantages"][i],
                    rows["rewards"][i],
                    rows["task_rewards"][i],
                    rows["length_penalties"][i],
                    rows["target_lengths"][i],
                    rows["policy_step"][i],
                )
                for i in range(start, end)
            ]
            start = end
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
