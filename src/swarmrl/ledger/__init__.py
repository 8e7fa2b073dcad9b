"""The pool's ledger: SQL tables (SQLAlchemy 2), migrations (Alembic), a consistency check
and the upload totals.

Names are loaded on first use (PEP 562): `swarmrl`'s argument parser registers
`pool check` (``cli``) for every subcommand and should not load SQLAlchemy to do it.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_MODELS = (
    "Account",
    "Assignment",
    "Base",
    "Checkpoint",
    "Contribution",
    "Heartbeat",
    "JournalEntry",
    "Member",
    "Nonce",
    "Slashing",
    "Step",
    "Submission",
    "Taint",
    "Verdict",
)
_WHERE = {
    **dict.fromkeys(_MODELS, "models"),
    "Ledger": "database",
    "LedgerError": "database",
    "check_ledger": "consistency",
    "migrate": "database",
    "snapshot": "consistency",
    "Uploads": "uploads",
    "upload_totals": "uploads",
}

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


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
