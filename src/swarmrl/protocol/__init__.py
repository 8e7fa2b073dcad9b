"""How roles talk to the orchestrator: the shared API models and the one signing HTTP client."""

from swarmrl.protocol.client import PoolClient, PoolRefused, PoolUnreachable

__all__ = ["PoolClient", "PoolRefused", "PoolUnreachable"]
