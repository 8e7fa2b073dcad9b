"""`swarmrl run`: a whole pool on one machine (`swarm.py`), its folder and command lines
(`launch.py`), its supervision (`watch.py`) and its summary (`summary.py`)."""

from swarmrl.run.launch import (
    check_model_dir,
    free_port,
    ledger_url,
    orchestrator_role,
    pool_roles,
    prepare_folder,
    prepare_pool,
    resolve_start_model,
)
from swarmrl.run.summary import RunSummary
from swarmrl.run.swarm import RunInterrupted, run_swarm
from swarmrl.run.watch import pool_status, wait_for_orchestrator, wait_report
from swarmrl.supervisor import SwarmError

__all__ = [
    "RunInterrupted",
    "RunSummary",
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
