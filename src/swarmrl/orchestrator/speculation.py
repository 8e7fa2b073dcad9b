"""Speculative re-issue: the share of an open assignment whose holder fell silent also
goes to an idle worker, so one silent worker does not stall its step.

A step whose need is covered by assignments out waits for every one of them: with one
holder silent (its link cut, its uploads failing), the whole pool waits until that
assignment lapses, up to its deadline. So when a worker holding nothing asks for work
and no step needs more, the pool looks at the open assignments of the steps still
short of samples. One is *overdue* when its holder missed a beat (a member holding work
beats twice per heartbeat interval, `protocol.membership.HOLDING_BEATS`), or when it has
been out `straggler_factor` times longer than the newest returned assignments took.
The share of an overdue assignment (the first assignment's id; a re-issue names it in
`covers`) is issued to the idle worker as a new assignment of the same step, with its
own id and seed, so validators recompute its prompts like any other's.

Of a share's assignments the first whose upload is accepted counts; a later upload for
the same share is refused before its body is read (one already streaming in is recorded
voided), and one never returned lapses, neither counted against its worker (the pool
lost nothing by it). A voided file is never listed for the
trainer, credited or paid, so nothing counts twice. A step's open work is counted in
shares, so a re-issue does not make the step look better covered than it is.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import aliased

from swarmrl.ledger import Assignment, Heartbeat, Submission
from swarmrl.ledger.models import LIVE_STATES, SHARE, share_of
from swarmrl.protocol.membership import HOLDING_BEATS

RECENT_RETURNS = 32  # newest returned assignments the usual duration is measured over

_twin = aliased(Assignment)


def share_won(share_id):
    """SQL: the share already has a live file (either assignment of it was returned)."""
    direct = (
        select(Submission.file_hash)
        .where(Submission.assignment_id == share_id, Submission.state.in_(LIVE_STATES))
        .exists()
    )
    covering = (
        select(Submission.file_hash)
        .join(_twin, _twin.id == Submission.assignment_id)
        .where(_twin.covers == share_id, Submission.state.in_(LIVE_STATES))
        .exists()
    )
    return direct | covering


# The open shares of a step not won yet: the work a step may still expect.
OPEN_SHARES = select(func.count(func.distinct(SHARE))).where(
    Assignment.step == bindparam("step"), Assignment.state == "issued", ~share_won(SHARE)
)
_WON = select(share_won(bindparam("share")))
_OPEN_IN = (
    select(
        Assignment.id,
        Assignment.covers,
        Assignment.step,
        Assignment.worker,
        Assignment.issued_at,
        Heartbeat.last_at,
    )
    .join(Heartbeat, Heartbeat.address == Assignment.worker)
    .where(Assignment.state == "issued", Assignment.step.in_(bindparam("steps", expanding=True)))
    .order_by(Assignment.step, Assignment.id)
)
_RECENT_DURATIONS = (
    select(Assignment.closed_at - Assignment.issued_at)
    .where(Assignment.state == "returned")
    .order_by(Assignment.id.desc())
    .limit(RECENT_RETURNS)
)


def won(c: Connection, share: int) -> bool:
    return bool(c.execute(_WON, {"share": share}).scalar())


def silence_allowed(heartbeat_seconds: float) -> float:
    """Seconds without a heartbeat before a holder counts as silent: a holder beats
    `HOLDING_BEATS` times per interval, so the gap between its beats, and a little slack
    for a beat that is merely late on a busy machine. Less than one interval: a cut
    holder stalls the pool for less than a heartbeat (docs/orchestrator.md)."""
    return heartbeat_seconds / HOLDING_BEATS + min(heartbeat_seconds / 4, 1.0)


@dataclass(frozen=True)
class Cover:
    """What an idle worker may be issued: `share` of `step` (None: nothing yet, look
    again in `retry_seconds`, when the first open share may have become overdue)."""

    share: int | None
    step: int | None
    retry_seconds: float | None


def share_to_cover(
    c: Connection,
    *,
    worker: str,
    steps: list[int],
    now: float,
    heartbeat_seconds: float,
    straggler_factor: float,
) -> Cover:
    """The oldest open share of `steps` whose every open assignment is overdue and none
    of which `worker` holds, or when to look again."""
    if not steps:
        return Cover(None, None, None)
    groups: dict[int, list] = {}
    for row in c.execute(_OPEN_IN, {"steps": steps}):
        groups.setdefault(share_of(row.id, row.covers), []).append(row)
    if not groups:
        return Cover(None, None, None)
    durations = [d for d in c.execute(_RECENT_DURATIONS).scalars() if d is not None]
    slow = straggler_factor * statistics.median(durations) if durations else float("inf")
    slow = max(slow, heartbeat_seconds)
    silence = silence_allowed(heartbeat_seconds)
    soonest = float("inf")
    for share, rows in groups.items():
        if any(r.worker == worker for r in rows):
            continue
        # Overdue once its holder is silent or it is a straggler; a share is covered
        # again only when all its open assignments are overdue.
        due = max(min(r.last_at + silence, r.issued_at + slow) for r in rows)
        if due > now:
            soonest = min(soonest, due - now)
        elif not won(c, share):
            return Cover(share, rows[0].step, None)
    return Cover(None, None, soonest if soonest < float("inf") else None)
