"""`swarmrl pool check --ledger URL`: the ledger's consistency check as a command.

Lists every broken invariant of `check_ledger` (nothing issued, submitted, accepted,
trained or paid lost or counted twice; the books add up), one line each, and exits 1
if there is any; 0 with one summary line when the ledger is consistent. It reads the
ledger the orchestrator writes (the database may be in use meanwhile), and refuses a
SQLite file that does not exist rather than creating an empty one, and a ledger of
another schema version rather than migrating it under a running orchestrator.
"""

from __future__ import annotations

import sys


def _check(args) -> int:
    from sqlalchemy import func, select

    from swarmrl.ledger import Ledger, LedgerError, Submission, check_ledger

    try:
        ledger = Ledger(args.ledger, create=False)
    except LedgerError as exc:
        print(f"swarmrl pool check: {exc}", file=sys.stderr)
        return 2
    try:
        with ledger.session() as s:
            problems = check_ledger(s)
            files = s.scalar(select(func.count()).select_from(Submission))
    finally:
        ledger.close()
    for problem in problems:
        print(problem)
    if problems:
        print(f"ledger {args.ledger}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"ledger {args.ledger}: consistent ({files} submissions)")
    return 0


def register(commands) -> None:
    """Adds `check` to the `swarmrl pool` subcommands."""
    p = commands.add_parser(
        "check",
        help="check the ledger's consistency (nothing lost or counted twice, books add up)",
        description="Every broken invariant of the ledger, one line each (exit 1 if any; "
        "docs/orchestrator.md, 'The ledger'). Safe while the orchestrator runs.",
    )
    p.add_argument(
        "--ledger",
        required=True,
        help="the ledger URL the orchestrator was given: sqlite:///FILE or postgresql://…",
    )
    p.set_defaults(func=_check)
