"""`swarmrl run`: a whole pool on one machine (`swarm.py`)."""

from swarmrl.run.swarm import (
    RunInterrupted,
    SwarmError,
    check_model_dir,
    free_port,
    ledger_url,
    orchestrator_role,
    pool_roles,
    pool_status,
    prepare_folder,
    prepare_pool,
    resolve_start_model,
    run_swarm,
    wait_for_orchestrator,
    wait_report,
)

__all__ = [
    "RunInterrupted",
    "SwarmError",
    "check_model_dir",
    "free_port",
    "ledger_url",
    "orchestrator_role",
    "pool_roles",
    "pool_status",
    "prepare_folder",
    "prepare_pool",
    "resolve_start_model",
    "run_swarm",
    "wait_for_orchestrator",
    "wait_report",
]
