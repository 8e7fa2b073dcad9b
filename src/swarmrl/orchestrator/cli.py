"""`swarmrl orchestrator`: serve the pool's API; every setting is a flag.

Settings come from the defaults, then a settings file (`--config FILE`, the one
`swarmrl run` writes to <run>/orchestrator/config.toml) or the members' run config
(`--run-config RUN.toml`, derived as `swarmrl run` derives them), then the flags, later
sources winning. `--write-config FILE` writes the result and exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swarmrl.config import ConfigError, load_config
from swarmrl.orchestrator.config import (
    OrchestratorConfig,
    load_orchestrator_config,
    read_orchestrator_config,
    run_settings,
    write_orchestrator_config,
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def settings_from_args(args: argparse.Namespace) -> OrchestratorConfig:
    """The settings the command line names. Raises ConfigError with one line."""
    flags = {
        name: getattr(args, name)
        for name in OrchestratorConfig.model_fields
        if getattr(args, name) is not None
    }
    if args.config is not None:
        return load_orchestrator_config(
            read_orchestrator_config(args.config), flags, str(args.config)
        )
    if args.run_config is not None:
        tree = run_settings(load_config(args.run_config))
        return load_orchestrator_config(tree, flags, f"{args.run_config} (derived)")
    return load_orchestrator_config({}, flags, "the defaults")


def _orchestrator(args) -> int:
    from swarmrl.ledger import LedgerError
    from swarmrl.orchestrator.server import serve

    try:
        config = settings_from_args(args)
    except ConfigError as exc:
        print(f"swarmrl orchestrator: {exc}", file=sys.stderr)
        return 2
    if args.write_config is not None:
        write_orchestrator_config(config, args.write_config)
        print(f"wrote the orchestrator's settings to {args.write_config}")
        return 0
    try:
        serve(config, args.host, args.port)
    except (LedgerError, ValueError, OSError) as exc:
        print(f"swarmrl orchestrator: {exc}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "orchestrator",
        help="serve the pool's HTTP API (ledger, assignments, uploads, verdicts)",
        description="The pool's front door. State lives in the ledger (SQLite file or PostgreSQL "
        "URL), uploaded rollout files in the store (fsspec URL); restart it at will. "
        "OpenAPI schema at /openapi.json (docs/orchestrator.md). Settings: the defaults, then "
        "--config FILE or --run-config RUN.toml, then the flags below.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8700, help="port (0 = any free port)")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML (or JSON) file of settings, e.g. <run>/orchestrator/config.toml as "
        "`swarmrl run` writes it or --write-config wrote it; the flags below override it",
    )
    source.add_argument(
        "--run-config",
        type=Path,
        default=None,
        metavar="RUN.toml",
        help="the members' run config (TOML): derive the recipe, timings, validation rate, "
        "stake and file bounds from it, as `swarmrl run` does",
    )
    p.add_argument(
        "--write-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the resulting settings to FILE (TOML) and exit instead of serving",
    )
    for name, field in OrchestratorConfig.model_fields.items():
        if field.annotation is bool:
            p.add_argument(
                _flag(name),
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{field.description} (default {field.default})",
            )
        else:
            p.add_argument(
                _flag(name), default=None, help=f"{field.description} (default {field.default})"
            )
    p.set_defaults(func=_orchestrator)
