"""The pool as `swarmrl status` shows it: members, steps, submissions, verdicts, money and
slashings, read from the ledger in one session.

Read-only: nothing here changes the ledger, so the status is served without the pool's
lock (`Pool.status`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from swarmrl.ledger import (
    Assignment,
    Contribution,
    Heartbeat,
    Member,
    Slashing,
    Step,
    Submission,
    Taint,
    Verdict,
)
from swarmrl.ledger.models import LIVE_STATES
from swarmrl.orchestrator import accounts
from swarmrl.protocol import models as api

STEPS_SHOWN = 20  # newest steps the status lists


def newest_steps(s: Session) -> Sequence[Step]:
    return s.scalars(select(Step).order_by(Step.step.desc()).limit(STEPS_SHOWN)).all()


def step_status(s: Session, row: Step, usable: int) -> api.StepStatus:
    """One step's counts; `usable` is the pool's current count of its usable samples."""
    counts = dict(
        s.execute(
            select(Assignment.state, func.count())
            .where(Assignment.step == row.step)
            .group_by(Assignment.state)
        ).all()
    )
    trained = s.scalar(
        select(func.count()).where(
            Submission.step == row.step, Submission.trained_step.is_not(None)
        )
    )
    return api.StepStatus(
        step=row.step,
        target_samples=row.target_samples,
        usable_samples=usable,
        read_samples=row.trainer_read,
        submissions=counts.get("returned", 0),
        open_assignments=counts.get("issued", 0),
        lapsed_assignments=counts.get("lapsed", 0),
        trained=int(trained or 0),
        full=row.full_at is not None,
    )


def pool_status(
    s: Session,
    *,
    view: api.HeartbeatResponse,
    steps: list[api.StepStatus],
    recipe: api.Recipe,
    rates: accounts.Rates,
    refusals: list[api.RefusedRegistration],
) -> api.PoolStatus:
    """The whole status: `view` is what heartbeats answer, `steps` the newest steps'
    `step_status`."""
    money = accounts.money_by_address(s, rates)
    none = accounts.Money()
    members = [
        api.Member(
            address=m.address,
            role=cast(api.Role, m.role),
            status="ejected" if m.ejected_at is not None else m.status,
            url=m.url,
            lapses=m.lapses,
            last_heartbeat=last_at,
            balance=money.get(m.address, none).balance,
            stake=money.get(m.address, none).stake,
            paid=money.get(m.address, none).paid,
            unpaid=money.get(m.address, none).unpaid,
        )
        for m, last_at in s.execute(
            select(Member, Heartbeat.last_at).join(Heartbeat).order_by(Member.role, Member.address)
        )
    ]
    # A live file the trainer used is counted as trained, not as still pending or
    # accepted; a caught worker's trained files keep their rejected or voided state.
    shown = case(
        (Submission.state.in_(LIVE_STATES) & Submission.trained_step.is_not(None), "trained"),
        else_=Submission.state,
    )
    by_state: dict[str, int] = {
        str(k): int(n) for k, n in s.execute(select(shown, func.count()).group_by(shown))
    }
    verdicts = {
        (accepted, soft): n
        for accepted, soft, n in s.execute(
            select(Verdict.accepted, Verdict.soft, func.count()).group_by(
                Verdict.accepted, Verdict.soft
            )
        )
    }
    contributions = [
        api.Contribution(worker=w, files=f, samples=int(n), tokens=int(t))
        for w, f, n, t in s.execute(
            select(
                Contribution.worker,
                func.count(),
                func.sum(Contribution.samples),
                func.sum(Contribution.tokens),
            )
            .where(Contribution.forfeited_at.is_(None))
            .group_by(Contribution.worker)
            .order_by(Contribution.worker)
        )
    ]
    tainted_steps: dict[str, set[int]] = {}
    for cause, trained_step in s.execute(select(Taint.cause, Taint.trained_step)):
        tainted_steps.setdefault(cause, set()).add(trained_step)
    slashings = [
        api.Slashing(
            address=x.address,
            at=x.at,
            step=x.step,
            file_hash=x.file_hash,
            reason=x.reason,
            slashed=accounts.from_units(x.amount),
            voided_files=x.voided_files,
            tainted_files=x.tainted_files,
            tainted_steps=sorted(tainted_steps.get(x.file_hash, ())),
        )
        for x in s.scalars(select(Slashing).order_by(Slashing.at, Slashing.file_hash))
    ]
    return api.PoolStatus(
        step=view.step,
        recipe=recipe,
        checkpoint=view.checkpoint,
        finished=view.finished,
        members=members,
        steps=steps,
        submissions={k: int(v) for k, v in by_state.items()},
        verdicts={
            "accepted": int(verdicts.get((True, False), 0)),
            "rejected": int(verdicts.get((False, False), 0)),
            "soft": int(verdicts.get((False, True), 0)),
        },
        contributions=contributions,
        slashings=slashings,
        refusals=refusals,
    )
