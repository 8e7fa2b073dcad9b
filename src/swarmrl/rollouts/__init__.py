"""Rollout files: the Parquet format workers write and trainers and validators read (docs/architecture.md §4.2)."""

from swarmrl.rollouts.files import (
    SCHEMA,
    SCHEMA_VERSION,
    RolloutFileError,
    RolloutMeta,
    file_hash,
    read_meta,
    read_rollouts,
    write_rollouts,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "RolloutFileError",
    "RolloutMeta",
    "file_hash",
    "read_meta",
    "read_rollouts",
    "write_rollouts",
]
