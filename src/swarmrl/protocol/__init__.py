"""How roles talk to the orchestrator: the shared API models and the one signing HTTP client.

The client is loaded on first use (PEP 562): `swarmrl`'s argument parser registers
`status` for every subcommand and should not load httpx and eth-account to do it.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmrl.protocol.client import PoolClient, PoolRefused, PoolUnreachable


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.client"), name)


__all__ = ["PoolClient", "PoolRefused", "PoolUnreachable"]
