"""The orchestrator: the pool's HTTP front door, keeping its state in the SQL ledger.

Names are loaded on first use (PEP 562): `swarmrl`'s argument parser reads the config
for every subcommand and should not load the web stack to do it.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {"OrchestratorConfig": "config", "OrchestratorThread": "server", "serve": "server"}

if TYPE_CHECKING:
    from swarmrl.orchestrator.config import OrchestratorConfig
    from swarmrl.orchestrator.server import OrchestratorThread, serve


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


__all__ = ["OrchestratorConfig", "OrchestratorThread", "serve"]
