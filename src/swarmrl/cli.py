"""The `swarmrl` command: one subcommand per role, plus `run` for a whole local swarm.

Every subcommand is registered the same way: a module's `register(sub)` adds its parser
and sets `func`, the function that runs it. The commands that belong to one package sit
in its `cli.py` (`validate`, the SHARDCAST servers, `keygen`, `orchestrator`, `filter`,
`pool check`); the others in `commands/`. Building the parser imports each of these
modules and nothing heavy: a command imports what it needs when it runs
(tests/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import logging
import sys

from swarmrl.commands import model, pool, roles, run, status
from swarmrl.config import ConfigError
from swarmrl.identity import cli as identity_cli
from swarmrl.orchestrator import cli as orchestrator_cli
from swarmrl.shardcast import cli as shardcast_cli
from swarmrl.tasks import cli as tasks_cli
from swarmrl.validator import cli as validator_cli

# In the order `swarmrl --help` lists them.
COMMANDS = (
    run,
    roles,
    model,
    validator_cli,
    shardcast_cli,
    identity_cli,
    orchestrator_cli,
    status,
    pool,
    tasks_cli,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarmrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"swarmrl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
