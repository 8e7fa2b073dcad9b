"""The pool's ledger: SQL tables (SQLAlchemy 2), migrations (Alembic), a consistency check and the upload totals."""

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
from swarmrl.ledger.uploads import Uploads, upload_totals

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
    "Uploads",
    "Verdict",
    "check_ledger",
    "migrate",
    "snapshot",
    "upload_totals",
]
