"""The orchestrator: the pool's HTTP front door, keeping its state in the SQL ledger."""

from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.server import OrchestratorThread, serve

__all__ = ["OrchestratorConfig", "OrchestratorThread", "serve"]
