"""Rollout files: the Parquet format workers write and trainers and validators read (docs/architecture.md §4.2).

``rows`` defines the row, ``files`` writes and strictly reads files, ``identity`` says
when two files or samples are the same.
"""

from swarmrl.rollouts.files import (
    LOOSE_BOUNDS,
    SCHEMA_VERSION,
    RolloutBounds,
    RolloutFileError,
    RolloutMeta,
    check_folder,
    check_rollout_table,
    file_hash,
    read_meta,
    read_rollouts,
    write_rollouts,
)
from swarmrl.rollouts.identity import AssignmentKey, SampleKey, SeenFiles
from swarmrl.rollouts.rows import COLUMNS, SCHEMA, Rollouts, empty_columns

__all__ = [
    "COLUMNS",
    "LOOSE_BOUNDS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "AssignmentKey",
    "RolloutBounds",
    "RolloutFileError",
    "RolloutMeta",
    "Rollouts",
    "SampleKey",
    "SeenFiles",
    "check_folder",
    "check_rollout_table",
    "empty_columns",
    "file_hash",
    "read_meta",
    "read_rollouts",
    "write_rollouts",
]
