"""`swarmrl orchestrator`: serve the pool's API; every config field is a flag."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from swarmrl.orchestrator.config import OrchestratorConfig


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _orchestrator(args) -> int:
    from swarmrl.ledger import LedgerError
    from swarmrl.orchestrator.server import serve

    values = {
        name: getattr(args, name)
        for name in OrchestratorConfig.model_fields
        if getattr(args, name) is not None
    }
    try:
        config = OrchestratorConfig.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{_flag(str(e['loc'][0]))}: {e['msg']}" for e in exc.errors())
        print(f"swarmrl orchestrator: {problems}", file=sys.stderr)
        return 2
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
        "OpenAPI schema at /openapi.json (docs/orchestrator.md).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8700, help="port (0 = any free port)")
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
