"""The ledger's invariants: nothing issued, submitted, accepted, trained or paid is lost
or counted twice, and the books add up. `check_ledger` lists every violation; an empty
list means consistent."""

from __future__ import annotations

from collections import Counter, defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmrl.ledger.models import (
    LIVE_STATES,
    Account,
    Assignment,
    Base,
    Contribution,
    JournalEntry,
    Member,
    Nonce,
    Slashing,
    Submission,
    Taint,
    Verdict,
    share_of,
)

# How each journal kind moves an account's (balance, stake).
MOVES = {
    "fund": (1, 0),
    "stake": (-1, 1),
    "release": (1, -1),
    "slash": (0, -1),
    "payout": (1, 0),
}


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
            elif verdict.accepted != (s.state == "accepted") or verdict.soft:
                problems.append(f"submission {s.file_hash[:12]} is {s.state} against its verdict")
        elif s.state == "pending" and verdict is not None:
            problems.append(f"submission {s.file_hash[:12]} has a verdict but is still pending")
        elif s.state == "voided" and verdict is not None and not verdict.soft:
            problems.append(f"submission {s.file_hash[:12]} is voided against its verdict")
        # Credited: accepted by a validator, or trained without having been chosen.
        credited = contributions.get(s.file_hash)
        creditable = s.state == "accepted" or (
            s.state == "pending" and not s.to_validate and s.trained_step is not None
        )
        if creditable:
            if credited is None:
                problems.append(f"{s.state} submission {s.file_hash[:12]} is not credited")
            elif (credited.worker, credited.step, credited.samples) != (
                s.worker,
                s.step,
                s.num_samples,
            ):
                problems.append(f"submission {s.file_hash[:12]} is credited with other numbers")
        elif credited is not None and not (s.state == "voided" and credited.forfeited_at):
            problems.append(f"{s.state} submission {s.file_hash[:12]} is credited")
        if s.trained_step is not None and s.state in ("rejected", "voided"):
            problems.append(f"{s.state} submission {s.file_hash[:12]} was trained")
        if s.trained_step is not None and s.to_validate and s.state != "accepted":
            problems.append(f"submission {s.file_hash[:12]} was trained before its verdict")
    # A re-issued share (assignments.covers) is filled once: the later file is voided.
    live_per_share = Counter(
        share_of(a.id, a.covers)
        for s in submissions
        if s.state in LIVE_STATES and (a := assignments.get(s.assignment_id)) is not None
    )
    for share, n in live_per_share.items():
        if n > 1:
            problems.append(f"share of assignment {share} has {n} live submissions")
    with_file = set(per_assignment)
    for a in assignments.values():
        if a.state == "returned" and a.id not in with_file:
            problems.append(f"assignment {a.id} is returned without a submission")
    known = {s.file_hash for s in submissions}
    for file_hash in set(verdicts) - known:
        problems.append(f"verdict for unknown submission {file_hash[:12]}")
    for file_hash in set(contributions) - known:
        problems.append(f"contribution for unknown submission {file_hash[:12]}")
    problems += _books(session, {s.file_hash: s for s in submissions}, verdicts, contributions)
    return problems


def _books(
    session: Session,
    submissions: dict[str, Submission],
    verdicts: dict[str, Verdict],
    contributions: dict[str, Contribution],
) -> list[str]:
    """The money: journal replays to the accounts, totals add up, each payout and slash
    happened once and for a reason."""
    problems: list[str] = []
    journal = list(session.scalars(select(JournalEntry).order_by(JournalEntry.id)))
    replayed: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    totals: Counter[str] = Counter()
    for e in journal:
        if e.amount < 0:
            problems.append(f"journal entry {e.id} ({e.kind}) has a negative amount")
        d_balance, d_stake = MOVES.get(e.kind, (0, 0))
        replayed[e.address][0] += d_balance * e.amount
        replayed[e.address][1] += d_stake * e.amount
        totals[e.kind] += e.amount
    accounts = {a.address: a for a in session.scalars(select(Account))}
    for address in set(accounts) | set(replayed):
        a = accounts.get(address)
        held = (a.balance, a.stake) if a is not None else (0, 0)
        if held != tuple(replayed[address]):
            problems.append(
                f"account {address}: balance, stake {held} but its journal sums to "
                f"{tuple(replayed[address])}"
            )
        if held[0] < 0 or held[1] < 0:
            problems.append(f"account {address} is negative: {held}")
    balances = sum(a.balance for a in accounts.values())
    stakes = sum(a.stake for a in accounts.values())
    if balances + stakes + totals["slash"] != totals["fund"] + totals["payout"]:
        problems.append(
            f"the books do not add up: balances {balances} + stakes {stakes} + slashed "
            f"{totals['slash']} != funded {totals['fund']} + paid {totals['payout']}"
        )

    payouts = Counter(e.file_hash for e in journal if e.kind == "payout")
    paid_entry = {e.file_hash: e for e in journal if e.kind == "payout"}
    for file_hash, n in payouts.items():
        if n > 1:
            problems.append(f"file {str(file_hash)[:12]} was paid {n} times")
    for c in contributions.values():
        payout = paid_entry.get(c.file_hash)
        if (c.paid_at is not None) != (payout is not None):
            problems.append(f"contribution {c.file_hash[:12]}: paid mark and journal disagree")
        elif payout is not None and (payout.amount, payout.address) != (c.amount, c.worker):
            problems.append(f"contribution {c.file_hash[:12]} was paid another amount or address")
        if c.paid_at is not None and c.forfeited_at is not None:
            problems.append(f"contribution {c.file_hash[:12]} is both paid and forfeited")
    for file_hash in set(paid_entry) - set(contributions):
        problems.append(f"payout for uncredited file {str(file_hash)[:12]}")

    slashings = {x.file_hash: x for x in session.scalars(select(Slashing))}
    slash_entries = {e.file_hash: e for e in journal if e.kind == "slash"}
    for file_hash in set(slashings) | set(slash_entries):
        sub = submissions.get(str(file_hash))
        verdict = verdicts.get(str(file_hash))
        if (
            sub is None
            or sub.state != "rejected"
            or verdict is None
            or verdict.accepted
            or verdict.soft
        ):
            problems.append(f"slash for {str(file_hash)[:12]} without a rejected verdict")
        x, slash = slashings.get(str(file_hash)), slash_entries.get(file_hash)
        if x is None or slash is None or (x.amount, x.address) != (slash.amount, slash.address):
            problems.append(f"slash for {str(file_hash)[:12]}: slashing and journal disagree")
    ejected = {m.address for m in session.scalars(select(Member)) if m.ejected_at is not None}
    for address in ejected - {x.address for x in slashings.values()}:
        problems.append(f"member {address} is ejected without a slashing")
    for c in contributions.values():
        if c.forfeited_at is not None and c.worker not in ejected:
            problems.append(
                f"contribution {c.file_hash[:12]} is forfeited by a member in good standing"
            )
    for taint in session.scalars(select(Taint)):
        sub = submissions.get(taint.file_hash)
        if sub is None or sub.trained_step != taint.trained_step or taint.cause not in slashings:
            problems.append(
                f"taint of {taint.file_hash[:12]} does not match a trained file and its slashing"
            )
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
