"""Write rollout Parquet files atomically, and read them strictly: parse, don't trust.

One file per work submission, one row per sample (``rows.Rollouts``). File-level
metadata (``RolloutMeta``) records the schema version, run id, worker address, the step
the file is for, the submission counter, and how many samples carry a non-zero
advantage (so a trainer can count usable samples from the footer alone). A file's
identity is the SHA-256 of its bytes (``file_hash``).

Every byte of a rollout file comes from an untrusted worker. ``read_rollouts`` is the
one reader the trainer, the validator and the CLI share. In this order, so that a
hostile file costs no more than an honest file of its byte size:

1. the file's byte size (``stat``), then the Parquet footer alone: typed metadata,
   schema, row count, and per column the number of values, the uncompressed size and
   the min/max statistics, against ``RolloutBounds`` (from the run's config);
2. the page headers of every column chunk (``pages.py``), because the footer's figures
   are claims: what each page says it decompresses to and how many values it decodes,
   summed, against the same bounds, before any page is decompressed;
3. only then the columns, as Arrow arrays, checked again without trusting the footer:
   nulls, UTF-8 of the string columns, per-row list lengths, token-id range, NaN/Inf;
4. a file in a ``step_<n>`` folder must say step n.

Anything refused raises ``RolloutFileError``, whose message is one line naming the file
and the problem.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from swarmrl.config.sections import CONTEXT_TOKENS
from swarmrl.rollouts.pages import PageError, chunk_pages
from swarmrl.rollouts.rows import FLOAT_COLUMNS, SCHEMA, STRING_COLUMNS, TOKEN_COLUMNS
from swarmrl.runfolder import step_of_folder

if TYPE_CHECKING:
    from swarmrl.config import RunConfig

SCHEMA_VERSION = 1
_META_KEY = b"swarmrl"
# Footer parsing limits: an honest footer is a few kB; these stop a footer that claims
# gigantic strings or lists from allocating them.
_THRIFT_STRING_LIMIT = 1 << 20
_THRIFT_CONTAINER_LIMIT = 1 << 16
# Bytes an honest sample may take beyond its tokens, logprobs and proofs: the problem id
# and the scalar columns, with room for Parquet's page and encoding overhead.
_ROW_OVERHEAD = 512
_FOOTER_ALLOWANCE = 1 << 16
# Pages a file may hold: a few per column chunk, and one per 8 KiB of what it may decode
# to (writers cut pages at about 1 MiB); this bounds the CPU a header walk can cost.
_MAX_PAGES_PER_CHUNK = 64
_MIN_PAGE_BYTES = 8192
TOPLOC_CHUNK = 32
PROOF_BYTES = 258


class RolloutFileError(ValueError):
    """A rollout file is unreadable or breaks the schema; the message names file and problem."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class RolloutMeta(BaseModel):
    """File-level metadata of a rollout file, as the worker claims it (strictly typed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(min_length=1, max_length=256, description="the run the file is for")
    worker_address: str = Field(
        min_length=1, max_length=256, description="the worker that produced the file"
    )
    step: int = Field(ge=0, lt=1 << 31, description="the training step the file is for")
    submission: int = Field(
        ge=0, lt=1 << 31, description="the worker's submission counter for the step"
    )
    num_samples: int = Field(ge=1, lt=1 << 31, description="rows in the file")
    num_nonzero: int = Field(ge=0, lt=1 << 31, description="samples in non-zero-advantage groups")
    schema_version: int = Field(default=SCHEMA_VERSION, description="rollout file format version")

    @model_validator(mode="after")
    def _consistent(self) -> RolloutMeta:
        if self.num_nonzero > self.num_samples:
            raise ValueError(f"num_nonzero {self.num_nonzero} > num_samples {self.num_samples}")
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema version {self.schema_version}, expected {SCHEMA_VERSION}")
        return self


class RolloutBounds(BaseModel):
    """What an honest file of this run can hold; decided from the run's config and model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_samples: int = Field(ge=1, description="prompts per file x group size")
    max_new_tokens: int = Field(ge=1, description="completion length limit")
    max_prompt_tokens: int = Field(ge=1, description="prompt length limit (the model's context)")
    vocab_size: int | None = Field(
        default=None, ge=1, description="token ids must lie in [0, vocab_size); None: only >= 0"
    )

    @classmethod
    def for_run(
        cls, cfg: RunConfig, *, vocab_size: int | None = None, context_tokens: int | None = None
    ) -> RolloutBounds:
        """Bounds from a ``RunConfig``: a file holds at most one submission of prompts x group."""
        new = cfg.sampling.max_new_tokens
        return cls(
            max_samples=cfg.worker.prompts_per_file * cfg.sampling.group_size,
            max_new_tokens=new,
            max_prompt_tokens=max(1, (context_tokens or CONTEXT_TOKENS) - new),
            vocab_size=vocab_size,
        )

    @property
    def max_proof_bytes(self) -> int:
        return math.ceil(self.max_new_tokens / TOPLOC_CHUNK) * PROOF_BYTES

    @property
    def max_sample_bytes(self) -> int:
        """Uncompressed bytes of the largest honest sample."""
        return (
            4 * self.max_prompt_tokens
            + 8 * self.max_new_tokens
            + self.max_proof_bytes
            + _ROW_OVERHEAD
        )

    @property
    def max_file_bytes(self) -> int:
        return self.max_samples * self.max_sample_bytes + _FOOTER_ALLOWANCE

    def max_values(self, column: str, rows: int) -> int:
        """Upper bound on a list column's leaf values over `rows` rows."""
        per_row = {
            "input_tokens": self.max_prompt_tokens,
            "output_tokens": self.max_new_tokens,
            "output_logprobs": self.max_new_tokens,
        }.get(column, 1)
        return rows * per_row


# Bounds that hold for any run, used when the caller has no config at hand.
LOOSE_BOUNDS = RolloutBounds(max_samples=1 << 16, max_new_tokens=1 << 16, max_prompt_tokens=1 << 16)


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
    table = table.replace_schema_metadata({_META_KEY: meta.model_dump_json().encode()})
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
        # Strict: a worker's string "3" is not the step 3.
        return RolloutMeta.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "metadata"
        raise RolloutFileError(
            path, f"malformed swarmrl metadata: {where}: {first['msg']}"
        ) from None


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(
            path,
            thrift_string_size_limit=_THRIFT_STRING_LIMIT,
            thrift_container_size_limit=_THRIFT_CONTAINER_LIMIT,
        )
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise RolloutFileError(path, f"not a readable Parquet file ({_one_line(exc)})") from None


def _one_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def read_meta(path: Path) -> RolloutMeta:
    """The file-level metadata, read from the Parquet footer only."""
    pf = _open(path)
    try:
        return _meta_from_schema(path, pf.schema_arrow)
    finally:
        pf.close()


def _same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    # Compare list types by element type: writers name the element field differently.
    if pa.types.is_list(expected) and pa.types.is_list(actual):
        return actual.value_type == expected.value_type
    return actual == expected


def _check_footer(path: Path, pf: pq.ParquetFile, bounds: RolloutBounds) -> RolloutMeta:
    """Everything decidable from the footer, before any column is decompressed."""
    try:
        return _footer(path, pf, bounds)
    except (OSError, ValueError, pa.ArrowException) as exc:
        if isinstance(exc, RolloutFileError):
            raise
        raise RolloutFileError(path, f"unreadable Parquet footer ({_one_line(exc)})") from None


def _footer(path: Path, pf: pq.ParquetFile, bounds: RolloutBounds) -> RolloutMeta:
    arrow_schema = pf.schema_arrow
    meta = _meta_from_schema(path, arrow_schema)
    missing = [name for name in SCHEMA.names if name not in arrow_schema.names]
    if missing:
        raise RolloutFileError(path, f"missing columns {missing}")
    for f in SCHEMA:
        actual = arrow_schema.field(f.name).type
        if not _same_type(actual, f.type):
            raise RolloutFileError(path, f"column {f.name!r} has type {actual}, expected {f.type}")
    extra = [n for n in arrow_schema.names if n not in SCHEMA.names]
    if extra:
        raise RolloutFileError(path, f"unexpected columns {extra[:5]}")
    md = pf.metadata
    rows = md.num_rows
    if rows != meta.num_samples:
        raise RolloutFileError(path, f"{rows} rows but metadata says {meta.num_samples}")
    if not 1 <= rows <= bounds.max_samples:
        raise RolloutFileError(path, f"{rows} rows; a file holds 1 to {bounds.max_samples}")
    leaf = {md.schema.column(i).path.split(".")[0]: i for i in range(md.num_columns)}
    uncompressed = 0
    for name, index in leaf.items():
        values = 0
        for g in range(md.num_row_groups):
            chunk = md.row_group(g).column(index)
            values += chunk.num_values
            uncompressed += chunk.total_uncompressed_size
            stats = chunk.statistics
            if name in TOKEN_COLUMNS and stats is not None and stats.has_min_max:
                _check_token_range(path, name, int(stats.min), int(stats.max), bounds)
        _values_within(path, f"column {name!r} holds", name, values, rows, bounds)
    budget = rows * bounds.max_sample_bytes + _FOOTER_ALLOWANCE
    _bytes_within(path, "columns", uncompressed, rows, budget)
    _check_pages(path, md, leaf, rows, budget, bounds)
    return meta


def _check_pages(
    path: Path, md, leaf: dict[str, int], rows: int, budget: int, bounds: RolloutBounds
) -> None:
    """The page headers' own figures against the bounds (module docstring, step 2)."""
    size = path.stat().st_size
    data_end = size - 8 - md.serialized_size  # the footer and its length + magic follow
    max_pages = _MAX_PAGES_PER_CHUNK + budget // _MIN_PAGE_BYTES
    uncompressed = 0
    with open(path, "rb") as fh:
        for name, index in leaf.items():
            values = 0
            for g in range(md.num_row_groups):
                chunk = md.row_group(g).column(index)
                start = _chunk_start(chunk)
                length = chunk.total_compressed_size
                if start < 4 or length < 0 or start + length > data_end:
                    raise RolloutFileError(
                        path, f"column {name!r}: its pages lie outside the file's data"
                    )
                fh.seek(start)
                try:
                    pages = chunk_pages(fh.read(length), max_pages)
                except PageError as exc:
                    raise RolloutFileError(path, f"column {name!r}: {exc}") from None
                max_pages -= pages.pages
                uncompressed += pages.uncompressed_bytes
                values += max(pages.values, pages.dictionary_values)
            _values_within(path, f"column {name!r}: its pages hold", name, values, rows, bounds)
    _bytes_within(path, "pages", uncompressed, rows, budget)


def _values_within(
    path: Path, what: str, name: str, values: int, rows: int, bounds: RolloutBounds
) -> None:
    # A list column's empty lists still count one value each, hence the `rows` slack.
    if values > bounds.max_values(name, rows) + rows:
        raise RolloutFileError(
            path,
            f"{what} {values} values; {rows} samples within the run's limits hold at most "
            f"{bounds.max_values(name, rows)}",
        )


def _bytes_within(path: Path, what: str, total: int, rows: int, budget: int) -> None:
    if total > budget:
        raise RolloutFileError(
            path,
            f"{what} decompress to {total} bytes; {rows} samples within the run's limits "
            f"take at most {budget}",
        )


def _chunk_start(chunk) -> int:
    """Where a column chunk's pages begin, as Parquet readers find it: at its dictionary
    page when it has one before the data pages, else at the first data page."""
    start = chunk.data_page_offset
    dictionary = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
    if dictionary is not None and 0 < dictionary < start:
        start = dictionary
    return start


def _check_token_range(path: Path, name: str, low: int, high: int, bounds: RolloutBounds) -> None:
    if low < 0:
        raise RolloutFileError(path, f"column {name!r} holds a negative token id ({low})")
    if bounds.vocab_size is not None and high >= bounds.vocab_size:
        raise RolloutFileError(
            path,
            f"column {name!r} holds token id {high}, outside the vocabulary [0, {bounds.vocab_size})",
        )


def _check_table_tokens(path: Path, table: pa.Table, bounds: RolloutBounds) -> None:
    for name in TOKEN_COLUMNS:
        values = table.column(name).combine_chunks().flatten()
        if len(values):
            span = pc.min_max(values).as_py()
            _check_token_range(path, name, span["min"], span["max"], bounds)


def check_rollout_table(path: Path, table: pa.Table, bounds: RolloutBounds) -> None:
    """The columns themselves, as Arrow arrays: the footer's figures are claims too.

    ``read_rollouts`` runs this; a caller that learns a bound later (the validator learns
    the vocabulary when it loads the claimed checkpoint) runs it again with that bound.
    """
    for name in SCHEMA.names:
        if table.column(name).null_count:
            raise RolloutFileError(path, f"column {name!r} has null values")
    for name in STRING_COLUMNS:
        # Parquet's reader takes a string column's bytes as they are; Python's decoding of
        # them later must not be where a bad byte is found.
        try:
            table.column(name).validate(full=True)
        except pa.ArrowInvalid as exc:
            raise RolloutFileError(
                path, f"column {name!r} is not valid UTF-8 ({_one_line(exc)})"
            ) from None
    lengths = {
        name: table.column(name).combine_chunks().value_lengths()
        for name in ("input_tokens", "output_tokens", "output_logprobs")
    }
    if not lengths["output_tokens"].equals(lengths["output_logprobs"]):
        raise RolloutFileError(path, "output_logprobs and output_tokens differ in length")
    for name, limit in (
        ("input_tokens", bounds.max_prompt_tokens),
        ("output_tokens", bounds.max_new_tokens),
    ):
        span = pc.min_max(lengths[name]).as_py()
        if span["min"] == 0:
            raise RolloutFileError(path, "a sample has an empty prompt or completion")
        if span["max"] > limit:
            raise RolloutFileError(
                path,
                f"a sample has {span['max']} {name.replace('_', ' ')}, above the limit {limit}",
            )
    proof_len = pc.max(pc.binary_length(table.column("proofs"))).as_py()
    if proof_len > bounds.max_proof_bytes:
        raise RolloutFileError(
            path, f"a sample has {proof_len} proof bytes, above the limit {bounds.max_proof_bytes}"
        )
    _check_table_tokens(path, table, bounds)
    for name in FLOAT_COLUMNS:
        column = table.column(name).combine_chunks()
        values = column.flatten() if pa.types.is_list(column.type) else column
        if len(values) and not pc.all(pc.is_finite(values)).as_py():
            raise RolloutFileError(path, f"column {name!r} holds NaN or infinity")


def check_folder(path: Path, meta: RolloutMeta) -> None:
    """A file in a ``step_<n>`` folder must be for step n (the folder is part of the claim)."""
    folder_step = step_of_folder(Path(path).parent)
    if folder_step is not None and folder_step != meta.step:
        raise RolloutFileError(
            path, f"file is for step {meta.step}, found in the folder of step {folder_step}"
        )


def read_rollouts(path: Path, bounds: RolloutBounds = LOOSE_BOUNDS) -> tuple[pa.Table, RolloutMeta]:
    """Read and check a rollout file (module docstring); ``RolloutFileError`` on any refusal."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise RolloutFileError(path, f"cannot read the file ({_one_line(exc)})") from None
    if size > bounds.max_file_bytes:
        raise RolloutFileError(
            path,
            f"{size} bytes; a file within the run's limits takes at most {bounds.max_file_bytes}",
        )
    pf = _open(path)
    try:
        meta = _check_footer(path, pf, bounds)
        check_folder(path, meta)
        try:
            table = pf.read(columns=list(SCHEMA.names))
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise RolloutFileError(
                path, f"not a readable Parquet file ({_one_line(exc)})"
            ) from None
    finally:
        pf.close()
    table = table.select(SCHEMA.names)
    if table.num_rows != meta.num_samples:
        raise RolloutFileError(path, f"{table.num_rows} rows but metadata says {meta.num_samples}")
    check_rollout_table(path, table, bounds)
    # One schema for every reader, whatever the writer named a list's element field.
    return table.cast(SCHEMA), meta
