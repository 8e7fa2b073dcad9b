"""The pool owner's side of funding: its key, and each worker funded to its stake.

A worker of a staked pool registers by locking `min_stake` from its balance, so the
owner funds each worker's address first (before or after the worker has a key running).
`swarmrl run` does it for its own workers; `swarmrl pool fund` (`commands/pool.py`) is
the same request by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.identity import Identity

# eth-account and httpx are imported where they are used, not here.


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
