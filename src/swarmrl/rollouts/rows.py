"""The rollout row: the one definition of what a sample holds, its Parquet schema derived from it.

``Rollouts`` is a file's rows column by column (one list entry per sample). The Parquet
``SCHEMA``, the worker's column builder, the trainer's samples and the validator's
checks all derive from it, so adding a column means adding one field here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa


def _column(arrow: pa.DataType, meaning: str) -> dict[str, Any]:
    return {"arrow": arrow, "meaning": meaning}


@dataclass(frozen=True)
class Rollouts:
    """A rollout file's samples, column by column (docs/architecture.md §4.2; docs/validator.md lists them)."""

    problem_id: list[str] = field(metadata=_column(pa.string(), "which task/prompt"))
    input_tokens: list[list[int]] = field(
        metadata=_column(pa.list_(pa.int32()), "prompt token ids")
    )
    output_tokens: list[list[int]] = field(
        metadata=_column(pa.list_(pa.int32()), "completion token ids")
    )
    output_logprobs: list[list[float]] = field(
        metadata=_column(
            pa.list_(pa.float32()), "the worker's sampling logprob of each completion token"
        )
    )
    rewards: list[float] = field(metadata=_column(pa.float32(), "task reward minus length penalty"))
    task_rewards: list[float] = field(metadata=_column(pa.float32(), "the verifier's reward"))
    length_penalties: list[float] = field(
        metadata=_column(pa.float32(), "alpha * |target - length|")
    )
    advantages: list[float] = field(metadata=_column(pa.float32(), "group-normalized reward"))
    target_lengths: list[int] = field(
        metadata=_column(pa.int32(), "target completion length, -1 where none")
    )
    policy_step: list[int] = field(
        metadata=_column(pa.int32(), "checkpoint step that generated the sample")
    )
    seed: list[int] = field(metadata=_column(pa.int64(), "sampling seed"))
    proofs: list[bytes] = field(metadata=_column(pa.binary(), "concatenated TOPLOC chunk proofs"))

    def __len__(self) -> int:
        return len(self.problem_id)

    @classmethod
    def from_table(cls, table: pa.Table) -> Rollouts:
        """Python lists from a table the strict reader (``files.read_rollouts``) has checked."""
        return cls(**{name: table.column(name).to_pylist() for name in COLUMNS})

    def replace(self, **columns: list) -> Rollouts:
        return dataclasses.replace(self, **columns)

    def to_columns(self) -> dict[str, list]:
        return {name: getattr(self, name) for name in COLUMNS}


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Rollouts))
SCHEMA = pa.schema([(f.name, f.metadata["arrow"]) for f in fields(Rollouts)])
TOKEN_COLUMNS = ("input_tokens", "output_tokens")
STRING_COLUMNS = tuple(f.name for f in SCHEMA if pa.types.is_string(f.type))
FLOAT_COLUMNS = tuple(
    f.name
    for f in SCHEMA
    if pa.types.is_floating(f.type)
    or (pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type))
)


def empty_columns() -> dict[str, list]:
    """One empty list per column: what a worker fills row by row."""
    return {name: [] for name in COLUMNS}
