"""Read a user's problem files (JSONL or Parquet) into validated problems and a fixed
train/eval split.

Formats, chosen by the file's extension:
- `.jsonl`: one JSON object per line; blank lines are skipped.
- `.parquet`: one row per problem; a null cell counts as a missing field.

Each task declares the fields it needs (`Field`): the names a column may go by (so a
`prompt` column can stand in for `question`), the types it accepts, and whether it is
required. Every error names the file, the line (JSONL) or row (Parquet, counted from
1), and what to fix.

The held-out split (`load_problems`) is either a second file (`eval_path`) or, without
one, the last `eval_size` problems of the training file. Either way a training problem
whose question text also appears in the eval split is dropped from training, so
`train_problem` can never hand out an eval problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from swarmrl.tasks.base import Problem

SUFFIXES = (".jsonl", ".parquet")

# How an accepted type reads in an error message. `list` means a list of strings.
_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", list: "a list of strings"}


class ProblemFileError(ValueError):
    """A problem file that cannot be used; the message says where and what to fix."""


@dataclass(frozen=True)
class Field:
    """One column of a problem file.

    `names`: the accepted column names, tried in order (the first one present wins).
    `types`: the accepted Python types of a value; `list` means a list of strings.
    `required`: whether every row must have it (a non-empty string if it is a string).
    """

    names: tuple[str, ...]
    types: tuple[type, ...]
    required: bool = True


def load_rows(path: str | Path, fields: Mapping[str, Field]) -> list[dict[str, object]]:
    """The rows of a problem file, each keyed by the `fields` keys (None where an
    optional field is absent). Raises FileNotFoundError or ProblemFileError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"problem file not found: {path} (resolved to {path.resolve()}); "
            f"give the path of a {' or '.join(SUFFIXES)} file"
        )
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records = _read_jsonl(path)
    elif suffix == ".parquet":
        records = _read_parquet(path)
    else:
        raise ProblemFileError(
            f"{path}: unsupported file type {path.suffix!r}; problem files must end in "
            f"{' or '.join(SUFFIXES)}"
        )
    if not records:
        raise ProblemFileError(f"{path}: the file holds no problems")
    return [_validate(record, where, fields) for where, record in records]


@dataclass(frozen=True)
class ProblemSplit:
    """A file-backed task's train and held-out problems, indexed as the Task protocol asks."""

    train: list[Problem]
    held_out: list[Problem]

    def num_train(self) -> int:
        return len(self.train)

    def train_problem(self, index: int) -> Problem:
        if not 0 <= index < len(self.train):
            raise IndexError(f"train index {index} out of range [0, {len(self.train)})")
        return self.train[index]

    def eval_problems(self) -> list[Problem]:
        return list(self.held_out)


class FileTask:
    """The Task methods of a task whose problems come from the user's files: a subclass
    sets ``instruction`` (the answer-format line of its prompts) and ``_split``, and
    defines ``score``."""

    instruction: str
    _split: ProblemSplit

    def num_train(self) -> int:
        return self._split.num_train()

    def train_problem(self, index: int) -> Problem:
        return self._split.train_problem(index)

    def eval_problems(self) -> list[Problem]:
        return self._split.eval_problems()

    def render_prompt(self, problem: Problem, target_length: int | None) -> str:
        return prompt_with_target(problem.question, self.instruction, target_length)


def prompt_with_target(question: str, instruction: str, target_length: int | None) -> str:
    """The question and the answer-format instruction, preceded by the paper's length
    instruction when there is a target."""
    lines = [question, instruction]
    if target_length is not None:
        lines.insert(0, f"Think for {target_length} tokens before giving a response.")
    return "\n".join(lines)


def load_problems(
    path: str | Path,
    *,
    eval_path: str | Path | None,
    eval_size: int | None,
    fields: Mapping[str, Field],
    make_problem: Callable[[dict[str, object], str], Problem],
) -> ProblemSplit:
    """Train and eval problems from a training file and an optional eval file.

    `make_problem(row, default_id)` turns a validated row into a Problem; the default
    id is `<file stem>-<position in the file, from 0>`, for rows without an `id`.
    Without `eval_path`, the eval split is the last `eval_size` problems of `path`
    (None: a tenth of them, at least one). With `eval_path`, `eval_size` must be None.
    """
    train = _problems(Path(path), fields, make_problem)
    if eval_path is not None:
        if eval_size is not None:
            raise ProblemFileError(
                f"give either eval_path ({eval_path}) or eval_size ({eval_size}), not "
                "both: with an eval file, all of its problems are the eval split"
            )
        held_out = _problems(Path(eval_path), fields, make_problem)
    else:
        size = max(1, len(train) // 10) if eval_size is None else eval_size
        if not 0 <= size < len(train):
            raise ProblemFileError(
                f"{path}: cannot hold out {size} of its {len(train)} problems for "
                "evaluation and keep at least one for training; lower eval_size, add "
                "problems, or give a separate eval_path"
            )
        train, held_out = train[: len(train) - size], train[len(train) - size :]

    eval_questions = {problem.question.strip() for problem in held_out}
    train = [problem for problem in train if problem.question.strip() not in eval_questions]
    if not train:
        raise ProblemFileError(
            f"{path}: every training problem also appears in the eval split; "
            "nothing is left to train on"
        )
    seen: dict[str, str] = {}
    for split, problems in (("train", train), ("eval", held_out)):
        for problem in problems:
            if problem.problem_id in seen:
                raise ProblemFileError(
                    f"problem id {problem.problem_id!r} is used twice ({seen[problem.problem_id]} "
                    f"and {split} split); ids must be unique across {path}"
                    + (f" and {eval_path}" if eval_path is not None else "")
                )
            seen[problem.problem_id] = f"{split} split"
    return ProblemSplit(train, held_out)


def _problems(
    path: Path,
    fields: Mapping[str, Field],
    make_problem: Callable[[dict[str, object], str], Problem],
) -> list[Problem]:
    rows = load_rows(path, fields)
    return [make_problem(row, f"{path.stem}-{index}") for index, row in enumerate(rows)]


def _read_jsonl(path: Path) -> list[tuple[str, object]]:
    records: list[tuple[str, object]] = []
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            where = f"{path}:line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ProblemFileError(f"{where}: not UTF-8 text ({error.reason})") from error
            if not line.strip():
                continue
            try:
                records.append((where, json.loads(line)))
            except json.JSONDecodeError as error:
                raise ProblemFileError(
                    f"{where}: not valid JSON ({error.msg} at column {error.colno}); "
                    "each line must be one complete JSON object"
                ) from error
    return records


def _read_parquet(path: Path) -> list[tuple[str, object]]:
    import pyarrow
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise ProblemFileError(f"{path}: not a readable Parquet file ({error})") from error
    return [(f"{path}:row {number}", row) for number, row in enumerate(table.to_pylist(), start=1)]


def _validate(record: object, where: str, fields: Mapping[str, Field]) -> dict[str, object]:
    if not isinstance(record, dict):
        raise ProblemFileError(
            f"{where}: expected a JSON object with named fields, got {type(record).__name__}"
        )
    row: dict[str, object] = {}
    for key, field in fields.items():
        name = next((name for name in field.names if record.get(name) is not None), None)
        if name is None:
            if field.required:
                accepted = " or ".join(repr(name) for name in field.names)
                found = ", ".join(repr(name) for name in record) or "none"
                raise ProblemFileError(
                    f"{where}: missing required field {accepted} (fields found: {found})"
                )
            row[key] = None
            continue
        value = record[name]
        if not _has_type(value, field.types):
            wanted = " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in field.types)
            raise ProblemFileError(
                f"{where}: field {name!r} must be {wanted}, got {_describe(value)}"
            )
        if field.required and (value == [] or (isinstance(value, str) and not value.strip())):
            raise ProblemFileError(f"{where}: field {name!r} is empty")
        row[key] = value
    return row


def _has_type(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true/false would otherwise pass as an int
        return bool in types
    if isinstance(value, list):
        return list in types and all(isinstance(item, str) for item in value)
    return isinstance(value, types)


def _describe(value: object) -> str:
    if isinstance(value, list):
        return "a list holding " + ", ".join(sorted({type(item).__name__ for item in value}))
    return f"{type(value).__name__} {value!r}"[:80]
