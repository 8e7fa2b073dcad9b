"""Where a training step's samples come from: the interface the trainer polls.

The trainer asks a `RolloutSource` for a step's collector and polls it until it holds
enough usable samples. The source is the orchestrator (`pool_source.py`); batches.py
does the reading and filtering of each file it hands in.
"""

from __future__ import annotations

from typing import Protocol

from swarmrl.trainer.batches import Sample


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

    @property
    def mismatched_files(self) -> int:
        """Files whose claimed rewards or advantages differed from the recomputed ones."""

    def poll(self) -> None:
        """Take in whatever arrived since the last call."""

    def take(self, batch_samples: int) -> list[Sample]:
        """Whole groups, oldest first, until at least `batch_samples` samples."""

    def report(self, full: bool = False) -> None:
        """Tell the pool the step's count (`full`: the trainer needs no more for it)."""

    def drop_withdrawn(self) -> int:
        """Forget samples of files withdrawn since they were read; the samples dropped."""

    def files_of(self, samples: list[Sample]) -> list[str]:
        """The hashes of the files `samples` came from."""


class RolloutSource(Protocol):
    def open_step(self, step: int) -> StepCollector:
        """A collector of the samples for training step `step`."""
