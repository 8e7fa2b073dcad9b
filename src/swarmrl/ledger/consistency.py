"""The ledger's invariants: nothing issued, submitted, accepted or trained is lost or
counted twice. `check_ledger` lists every violation; an empty list means consistent."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmrl.ledger.models import (
    Assignment,
    Base,
    Contribution,
    Nonce,
    Submission,
    Verdict,
)


def check_ledger(session: Session) -> list[str]:
    """Every broken invariant, one line each."""
    problems: list[str] = []
    assignments = {a.id: a for a in session.scalars(select(Assignment))}
    submissions = list(session.scalars(select(Submission)))
    verdicts = {v.file_hash: v for v in session.scalars(select(Verdict))}
    contributions = {c.file_hash: c for c in session.scalars(select(Contribution))}

    per_assignment = Counter(s.assignment_id for s in submissions)
    for assignment_id, n in per_assignment.items():
        if n > 1:
            problems.append(f"assignment {assignment_id} has {n} submissions")
    for s in submissions:
        a = assignments.get(s.assignment_id)
        if a is None:
            problems.append(
                f"submission {s.file_hash[:12]} names unknown assignment {s.assignment_id}"
            )
            continue
        if (a.worker, a.step) != (s.worker, s.step):
            problems.append(
                f"submission {s.file_hash[:12]} (worker {s.worker}, step {s.step}) does not match "
                f"assignment {a.id} (worker {a.worker}, step {a.step})"
            )
        if a.state != "returned":
            problems.append(f"assignment {a.id} has a submission but is {a.state}")
        verdict = verdicts.get(s.file_hash)
        if s.state in ("accepted", "rejected"):
            if verdict is None:
                problems.append(f"submission {s.file_hash[:12]} is {s.state} without a verdict")
            elif verdict.accepted != (s.state == "accepted"):
                problems.append(f"submission {s.file_hash[:12]} is {s.state} against its verdict")
        elif s.state == "pending" and verdict is not None:
            problems.append(f"submission {s.file_hash[:12]} has a verdict but is still pending")
        credited = contributions.get(s.file_hash)
        if s.state == "accepted":
            if credited is None:
                problems.append(f"accepted submission {s.file_hash[:12]} is not credited")
            elif (credited.worker, credited.step, credited.samples) != (
                s.worker,
                s.step,
                s.num_samples,
            ):
                problems.append(f"submission {s.file_hash[:12]} is credited with other numbers")
        elif credited is not None:
            problems.append(f"{s.state} submission {s.file_hash[:12]} is credited")
        if s.trained_step is not None and s.state in ("rejected", "voided"):
            problems.append(f"{s.state} submission {s.file_hash[:12]} was trained")
    with_file = set(per_assignment)
    for a in assignments.values():
        if a.state == "returned" and a.id not in with_file:
            problems.append(f"assignment {a.id} is returned without a submission")
    known = {s.file_hash for s in submissions}
    for file_hash in set(verdicts) - known:
        problems.append(f"verdict for unknown submission {file_hash[:12]}")
    for file_hash in set(contributions) - known:
        problems.append(f"contribution for unknown submission {file_hash[:12]}")
    return problems


def snapshot(session: Session) -> dict[str, list[tuple]]:
    """Every row of every table except the nonces (which any signed request spends), so a
    test can show that a refused request changed nothing else."""
    out: dict[str, list[tuple]] = {}
    for table in Base.metadata.sorted_tables:
        if table.name == Nonce.__tablename__:
            continue
        rows = session.execute(select(table)).all()
        out[table.name] = sorted((tuple(r) for r in rows), key=repr)
    return out
