"""Loading a run config: defaults < a TOML (or JSON) file < dotted command-line flags,
and one-line errors that name the field."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from swarmrl.config.run import RunConfig


class ConfigError(ValueError):
    """A configuration value is invalid; the message is one line naming the field."""


def _flat_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_flat_fields(annotation, f"{prefix}{name}."))
        else:
            out.append((f"{prefix}{name}", field))
    return out


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE` and one `--<dotted.field>` flag per field, with its help text."""
    parser.add_argument("--config", type=Path, help="TOML file with any of the fields below")
    for dotted, field in _flat_fields(RunConfig):
        default = field.default if field.default_factory is None else field.default_factory()
        parser.add_argument(
            f"--{dotted}",
            dest=f"cfg__{dotted}",
            metavar="VALUE",
            default=None,
            help=f"{field.description} [default: {json.dumps(default)}]",
        )
    # Old names still accepted (the model maps them and warns), no longer advertised.
    parser.add_argument(
        "--task.length_penalty",
        dest="cfg__task.length_penalty",
        default=None,
        help=argparse.SUPPRESS,
    )


def _is_text(annotation: Any) -> bool:
    """A field typed `str` or `str | None`: its flag value is taken as written."""
    return annotation is str or (
        get_origin(annotation) in (Union, UnionType) and str in get_args(annotation)
    )


_TEXT_FIELDS = {dotted for dotted, field in _flat_fields(RunConfig) if _is_text(field.annotation)}


def _parse_flag(dotted: str, value: str) -> Any:
    # Flags arrive as text; JSON gives numbers, booleans, lists and null their types, and
    # anything that is not JSON is taken as a plain string. A text field keeps the text as
    # written, so `--run_name 2024` names a run "2024" rather than failing as a number.
    if dotted in _TEXT_FIELDS:
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def one_line(err: ValidationError) -> str:
    """`invalid config: FIELD: WHAT (got VALUE)`, for the first problem pydantic found."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    got = (
        f" (got {json.dumps(first['input'], default=str)})"
        if "input" in first and not isinstance(first["input"], dict)
        else ""
    )
    return f"invalid config: {where}: {first['msg']}{got}"


def read_config_file(path: Path, example: str = "examples/arithmetic.toml") -> dict:
    """The tree in a TOML file (`.toml`) or a JSON file (any other name). Raises
    ConfigError with one line when the file is missing, unreadable or not valid."""
    try:
        text = Path(path).read_text()
        return tomllib.loads(text) if Path(path).suffix == ".toml" else json.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(
            f"--config {path} is a directory; give a TOML (or JSON) file, e.g. {example}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid: {exc}") from None


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults < TOML file < overrides (dotted keys). Raises ConfigError with one line."""
    tree: dict = {} if path is None else read_config_file(path)
    for dotted, value in (overrides or {}).items():
        _set_dotted(tree, dotted, value)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(one_line(exc)) from None


def config_from_args(args: argparse.Namespace) -> RunConfig:
    overrides = {
        key.removeprefix("cfg__"): _parse_flag(key.removeprefix("cfg__"), value)
        for key, value in vars(args).items()
        if key.startswith("cfg__") and value is not None
    }
    return load_config(args.config, overrides)
