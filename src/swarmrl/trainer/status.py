"""`trainer_status.json`: the step the trainer waits on and its usable samples so far,
written by the trainer and read by `swarmrl run`'s console (no other role reads it)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class TrainerStatus(BaseModel):
    step: int = Field(description="the step the trainer is collecting samples for")
    usable: int = Field(description="usable samples it has for the step so far")
    needed: int = Field(description="samples the step trains on (trainer.batch_samples)")
    since: float = Field(description="unix time the trainer began waiting for the step")

    def write(self, path: Path) -> None:
        """Write to a temporary name and rename: a reader never sees half a file."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.model_dump_json())
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> TrainerStatus | None:
        """The status in `path`, or None while there is none (or it is being replaced)."""
        try:
            return cls.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None
