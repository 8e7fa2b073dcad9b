"""The pool's ledger: SQL tables (SQLAlchemy 2), migrations (Alembic) and a consistency check."""

from swarmrl.ledger.consistency import check_ledger, snapshot
from swarmrl.ledger.database import Ledger, LedgerError, migrate
from swarmrl.ledger.models import (
    Assignment,
    Base,
    Checkpoint,
    Contribution,
    Heartbeat,
    Member,
    Nonce,
    Step,
    Submission,
    Verdict,
)

__all__ = [
    "Assignment",
    "Base",
    "Checkpoint",
    "Contribution",
    "Heartbeat",
    "Ledger",
    "LedgerError",
    "Member",
    "Nonce",
    "Step",
    "Submission",
    "Verdict",
    "check_ledger",
    "migrate",
    "snapshot",
]
