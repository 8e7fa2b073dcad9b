"""`swarmrl pool`: the pool owner's commands: `fund` adds to an address's balance (signed
with the owner's key), `check` checks the ledger's consistency (`ledger/cli.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# eth-account and httpx are imported where they are used, not here: `swarmrl`'s argument
# parser registers `pool` for every subcommand and must not load them to do it.


def _fund(args: argparse.Namespace) -> int:
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.protocol.client import PoolClient, PoolRefused, PoolUnreachable

    try:
        owner = load_identity(args.key)
    except KeyFileError as exc:
        print(f"swarmrl pool fund: {exc}", file=sys.stderr)
        return 1
    try:
        with PoolClient(args.orchestrator, owner, retry_seconds=args.timeout) as client:
            account = client.fund(args.address, args.amount)
    except (PoolRefused, PoolUnreachable, ValueError) as exc:
        print(f"swarmrl pool fund: {exc}", file=sys.stderr)
        return 1
    print(f"{account.address}: balance {account.balance:g}, stake {account.stake:g}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from swarmrl.ledger.cli import register as register_check

    p = sub.add_parser("pool", help="the pool's commands: fund an address, check the ledger")
    commands = p.add_subparsers(dest="pool_command", required=True)
    register_check(commands)
    f = commands.add_parser(
        "fund",
        help="add AMOUNT to ADDRESS's balance (signed with the owner's key)",
        description="Only the orchestrator's configured owner (--owner) may fund. A worker of a "
        "staked pool (--min-stake > 0) locks its stake from this balance when it registers.",
    )
    f.add_argument("address", help="the address to fund (0x…, e.g. printed by `swarmrl keygen`)")
    f.add_argument("amount", type=float, help="amount added to its balance (> 0)")
    f.add_argument(
        "--orchestrator", required=True, help="orchestrator URL, e.g. http://127.0.0.1:8700"
    )
    f.add_argument("--key", type=Path, required=True, help="the pool owner's key file")
    f.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to keep trying an unreachable pool"
    )
    f.set_defaults(func=_fund)
