"""`swarmrl pool fund`: the pool owner adds to an address's balance, signed with its key.

A worker of a staked pool registers by locking `min_stake` from its balance, so the
owner funds each worker's address first (before or after the worker has a key running).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.identity import Identity

# eth-account and httpx are imported where they are used, not here: `swarmrl`'s argument
# parser registers `pool` for every subcommand and must not load them to do it.


def owner_key(path: Path) -> Identity:
    """The pool owner's key in `path`, written (mode 0600) on first use."""
    from swarmrl.identity import generate_key_file, load_identity

    path = Path(path)
    if path.exists():
        return load_identity(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return generate_key_file(path)


def fund_workers(url: str, owner: Identity, workers: Iterable[Identity], stake: float) -> None:
    """Fund each worker with what it lacks to lock `stake` (nothing on a resumed run
    whose workers are staked already)."""
    from swarmrl.protocol.client import PoolClient

    if stake <= 0:
        return
    with PoolClient(url, owner) as client:
        held = {m.address: m.balance + m.stake for m in client.status().members}
        for worker in workers:
            missing = stake - held.get(worker.address, 0.0)
            if missing > 0:
                client.fund(worker.address, missing)


def _fund(args) -> int:
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


def register(sub) -> None:
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
