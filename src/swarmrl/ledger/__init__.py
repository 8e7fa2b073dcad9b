"""The pool's ledger: SQL tables (SQLAlchemy 2), migrations (Alembic) and a consistency check."""

from swarmrl.ledger.consistency import check_ledger, snapshot
from swarmrl.ledger.database import Ledger, LedgerError, migrate
from swarmrl.ledger.models import (
    Account,
    Assignment,
    Base,
    Checkpoint,
    Contribution,
    Heartbeat,
    JournalEntry,
    Member,
    Nonce,
    Slashing,
    Step,
    Submission,
    Taint,
    Verdict,
)

__all__ = [
    "Account",
    "Assignment",
    "Base",
    "Checkpoint",
    "Contribution",
    "Heartbeat",
    "JournalEntry",
    "Ledger",
    "LedgerError",
    "Member",
    "Nonce",
    "Slashing",
    "Step",
    "Submission",
    "Taint",
    "Verdict",
    "check_ledger",
    "migrate",
    "snapshot",
]
