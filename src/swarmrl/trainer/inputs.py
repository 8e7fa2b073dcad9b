"""Where a training step's samples come from: the interface, and the run folder behind it.

The trainer asks a `RolloutSource` for a step's collector and polls it until it holds
enough usable samples. Today the source is the run folder's `rollouts/step_<n>/`
(batches.py does the reading and filtering); a pool would put an orchestrator's list of
accepted submissions behind the same two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swarmrl.rollouts import LOOSE_BOUNDS, RolloutBounds
from swarmrl.runfolder import RunFolder
from swarmrl.trainer.batches import BatchCollector, Sample


class StepCollector(Protocol):
    """The usable samples of one step gathered so far, and what was dropped on the way."""

    seen: set[str]
    rejected: list[tuple[str, str]]
    dropped_stale: int
    dropped_zero: int
    all_rewards: list[float]
    all_task_rewards: list[float]
    all_length_penalties: list[float]
    all_length_errors: list[float]

    @property
    def usable(self) -> int: ...

    def poll(self) -> None:
        """Take in whatever arrived since the last call."""

    def take(self, batch_samples: int) -> list[Sample]:
        """Whole groups, oldest first, until at least `batch_samples` samples."""


class RolloutSource(Protocol):
    def open_step(self, step: int) -> StepCollector:
        """A collector of the samples for training step `step`."""


@dataclass(frozen=True)
class RolloutFolderSource:
    """Rollout files written into `rollouts/step_<n>/` of a run folder."""

    folder: RunFolder
    async_level: int
    bounds: RolloutBounds = LOOSE_BOUNDS

    def open_step(self, step: int) -> StepCollector:
        return BatchCollector(
            Path(self.folder.rollout_step(step)), step, self.async_level, bounds=self.bounds
        )
