"""Identity by content: which assignment a file answers, and whether it was already counted.

A file is the same file whatever its name: its identity is the SHA-256 of its bytes
(``files.file_hash``), as the ledger keys submissions. A sample is the same sample
whatever file carries it: (assignment, row index). Today an assignment is named by the
step, the worker address and the worker's submission counter in the file's metadata
(``swarmrl.assignment``); ``AssignmentKey.ledger_id`` is where an id issued by the
orchestrator's ledger goes once it issues them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from swarmrl.rollouts.files import RolloutMeta


class AssignmentKey(NamedTuple):
    """One issued assignment (one work submission's prompts)."""

    step: int
    worker_address: str
    submission: int
    ledger_id: str | None = None

    @classmethod
    def of(cls, meta: RolloutMeta) -> AssignmentKey:
        return cls(meta.step, meta.worker_address, meta.submission)

    def __str__(self) -> str:
        if self.ledger_id is not None:
            return f"assignment {self.ledger_id}"
        return f"step {self.step} submission {self.submission} of {self.worker_address}"


class SampleKey(NamedTuple):
    assignment: AssignmentKey
    row: int


@dataclass
class SeenFiles:
    """The files counted so far, by content hash and by assignment (first arrival wins)."""

    by_hash: dict[str, str] = field(default_factory=dict)
    by_assignment: dict[AssignmentKey, str] = field(default_factory=dict)

    def add(self, name: str, digest: str, key: AssignmentKey) -> None:
        self.by_hash.setdefault(digest, name)
        self.by_assignment.setdefault(key, name)

    def duplicate_reason(self, digest: str, key: AssignmentKey) -> str | None:
        """One line saying which counted file this one repeats, or None."""
        if digest in self.by_hash:
            return f"the same bytes as {self.by_hash[digest]} (sha256 {digest[:12]})"
        if key in self.by_assignment:
            return f"{key} was already answered by {self.by_assignment[key]}"
        return None
