"""The pool's ledger: SQL tables (SQLAlchemy 2), migrations (Alembic) and a consistency check.

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
    "Verdict",
    "check_ledger",
    "migrate",
    "snapshot",
]
