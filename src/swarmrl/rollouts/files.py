"""Write and read rollout Parquet files, atomically and with schema checks.

One file per work submission, one row per sample. File-level metadata records the
schema version, run id, worker address, the step the file is for, and how many samples
carry a non-zero advantage (so a trainer can count usable samples from the footer
alone). A file's identity is the SHA-256 of its bytes (`file_hash`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1
_META_KEY = b"swarmrl"

SCHEMA = pa.schema(
    [
        ("problem_id", pa.string()),
        ("input_tokens", pa.list_(pa.int32())),
        ("output_tokens", pa.list_(pa.int32())),
        ("output_logprobs", pa.list_(pa.float32())),
        ("rewards", pa.float32()),
        ("task_rewards", pa.float32()),
        ("length_penalties", pa.float32()),
        ("advantages", pa.float32()),
        ("target_lengths", pa.int32()),
        ("policy_step", pa.int32()),
        ("seed", pa.int64()),
        ("proofs", pa.binary()),
    ]
)


class RolloutFileError(ValueError):
    """A rollout file is unreadable or breaks the schema; the message names file and problem."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


@dataclass(frozen=True)
class RolloutMeta:
    """File-level metadata of a rollout file."""

    run_id: str
    worker_address: str
    step: int
    submission: int
    num_samples: int
    num_nonzero: int
    schema_version: int = SCHEMA_VERSION


def file_hash(path: Path) -> str:
    """SHA-256 hex of a file's bytes: the file's identity in submissions."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_rollouts(path: Path, columns: dict[str, list], meta: RolloutMeta) -> Path:
    """Write a rollout file atomically: a hidden temporary name, fsync, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pydict(columns, schema=SCHEMA)
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta.__dict__).encode()})
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def _meta_from_schema(path: Path, schema: pa.Schema) -> RolloutMeta:
    raw = (schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise RolloutFileError(path, "no swarmrl metadata in the Parquet footer")
    try:
        meta = RolloutMeta(**json.loads(raw))
    except (json.JSONDecodeError, TypeError) as exc:
        raise RolloutFileError(path, f"malformed swarmrl metadata: {exc}") from None
    if meta.schema_version != SCHEMA_VERSION:
        raise RolloutFileError(
            path, f"schema version {meta.schema_version}, expected {SCHEMA_VERSION}"
        )
    return meta


def read_meta(path: Path) -> RolloutMeta:
    """The file-level metadata, read from the Parquet footer only."""
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise RolloutFileError(path, f"not a readable Parquet file ({exc})") from None
    return _meta_from_schema(path, schema)


def read_rollouts(path: Path) -> tuple[pa.Table, RolloutMeta]:
    """Read and check a rollout file: columns, types, per-row list lengths."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise RolloutFileError(path, f"not a readable Parquet file ({exc})") from None
    meta = _meta_from_schema(path, table.schema)
    missing = [f.name for f in SCHEMA if f.name not in table.column_names]
    if missing:
        raise RolloutFileError(path, f"missing columns {missing}")
    for field in SCHEMA:
        actual = table.schema.field(field.name).type
        # Compare list types by element type: writers name the element field differently.
        same = (
            (actual.value_type == field.type.value_type)
            if pa.types.is_list(field.type) and pa.types.is_list(actual)
            else actual == field.type
        )
        if not same:
            raise RolloutFileError(
                path, f"column {field.name!r} has type {actual}, expected {field.type}"
            )
    if table.num_rows != meta.num_samples:
        raise RolloutFileError(path, f"{table.num_rows} rows but metadata says {meta.num_samples}")
    for name in SCHEMA.names:
        if table.column(name).null_count:
            raise RolloutFileError(path, f"column {name!r} has null values")
    out_len = table.column("output_tokens").combine_chunks().value_lengths()
    lp_len = table.column("output_logprobs").combine_chunks().value_lengths()
    if out_len != lp_len:
        raise RolloutFileError(path, "output_logprobs and output_tokens differ in length")
    if (
        min(out_len.to_pylist() or [1]) == 0
        or min(table.column("input_tokens").combine_chunks().value_lengths().to_pylist() or [1])
        == 0
    ):
        raise RolloutFileError(path, "a sample has an empty prompt or completion")
    return table.select(SCHEMA.names), meta
