"""What the dashboard shows beyond the pool status: the run's pace, the learning curves,
each member's files and held checkpoint, verdicts over time by check, and each
checkpoint's spread, read from the ledger in one session.

Read-only, like `status.py`. Every list is bounded (the newest `VERDICTS_SHOWN`
verdicts, `CHECKPOINTS_SHOWN` checkpoints), except the members and the curves, which
grow with the pool and the run, not with what strangers send.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmrl.ledger import Assignment, Checkpoint, Heartbeat, Member, Submission, Verdict
from swarmrl.ledger.models import CheckpointArrival, TrainingMetrics
from swarmrl.protocol import models as api

VERDICTS_SHOWN = 2000
CHECKPOINTS_SHOWN = 20
PACE_CHECKPOINTS = 10  # steps per minute over the newest this many checkpoints


class RunPace(BaseModel):
    step: int | None = Field(description="the step workers generate for")
    steps_total: int | None
    steps_per_minute: float | None = Field(description="over the newest checkpoints")
    eta_seconds: float | None = Field(description="to the last step at that pace")
    needed: int = Field(0, description="the current step's usable samples needed")
    issued: int = Field(0, description="samples the step's assignments asked for")
    uploaded: int = Field(0, description="samples in the step's uploaded files")
    usable: int = 0
    trained: int = Field(0, description="samples of the step's files the trainer trained")


class CurvePoint(BaseModel):
    step: int
    at: float
    reward: float | None
    task_reward: float | None
    length_error: float | None
    grad_norm: float | None
    clip_ratio: float | None
    entropy: float | None
    staleness_mean: float
    staleness_max: int
    samples: int
    step_seconds: float
    heldout_accuracy: float | None


class MemberActivity(BaseModel):
    address: str
    uploaded: int = Field(0, description="files uploaded")
    accepted: int = Field(0, description="files a validator accepted")
    rejected: int = 0
    voided: int = 0
    trained: int = Field(0, description="files the trainer trained")
    samples: int = Field(0, description="samples uploaded")
    samples_per_second: float | None = Field(None, description="between its first and last upload")
    holds: int | None = Field(None, description="the newest checkpoint its heartbeat says it holds")


class VerdictEvent(BaseModel):
    at: float
    step: int
    outcome: str = Field(description="accepted, rejected or soft")
    check: str | None = Field(description="the failed check a reject names")


class Arrival(BaseModel):
    address: str
    role: str
    seconds: float = Field(description="from the checkpoint's announcement to its first heartbeat")


class CheckpointSpread(BaseModel):
    step: int
    blake3: str
    announced_at: float
    final: bool
    arrivals: list[Arrival]


class Dashboard(BaseModel):
    now: float
    status: api.PoolStatus
    run: RunPace
    curves: list[CurvePoint]
    members: list[MemberActivity]
    verdicts: list[VerdictEvent] = Field(description=f"the newest {VERDICTS_SHOWN}, oldest first")
    by_check: dict[str, int] = Field(description="rejects of every verdict, by failed check")
    checkpoints: list[CheckpointSpread] = Field(description="the newest, oldest first")


def failed_check(reason: str) -> str:
    """The check a reject's reason names: 'rejected: toploc: sample 3: ...' -> 'toploc'."""
    parts = reason.split(": ", 2)
    return parts[1] if parts[0] == "rejected" and len(parts) > 1 else parts[0]


def run_pace(s: Session, status: api.PoolStatus) -> RunPace:
    total = status.recipe.steps if status.recipe else None
    times = s.execute(
        select(Checkpoint.step, Checkpoint.announced_at)
        .order_by(Checkpoint.step.desc())
        .limit(PACE_CHECKPOINTS)
    ).all()
    rate = None
    if len(times) >= 2 and times[0][1] > times[-1][1]:
        rate = (times[0][0] - times[-1][0]) / (times[0][1] - times[-1][1]) * 60
    eta = None
    if rate and total is not None and status.step is not None:
        eta = max(0, total - status.step) / rate * 60
    pace = RunPace(step=status.step, steps_total=total, steps_per_minute=rate, eta_seconds=eta)
    current = next((x for x in status.steps if x.step == status.step), None)
    if current is None:
        return pace
    issued = s.scalar(
        select(func.sum(Assignment.prompts * Assignment.group_size)).where(
            Assignment.step == current.step
        )
    )
    uploaded, trained = s.execute(
        select(
            func.sum(Submission.num_samples),
            func.sum(Submission.num_samples).filter(Submission.trained_step.is_not(None)),
        ).where(Submission.step == current.step)
    ).one()
    return pace.model_copy(
        update={
            "needed": current.target_samples,
            "issued": int(issued or 0),
            "uploaded": int(uploaded or 0),
            "usable": current.usable_samples,
            "trained": int(trained or 0),
        }
    )


def curves(s: Session) -> list[CurvePoint]:
    return [
        CurvePoint(
            step=m.step,
            at=m.reported_at,
            reward=m.reward,
            task_reward=m.task_reward,
            length_error=m.length_error,
            grad_norm=m.grad_norm,
            clip_ratio=m.clip_ratio,
            entropy=m.entropy,
            staleness_mean=m.staleness_mean,
            staleness_max=m.staleness_max,
            samples=m.samples,
            step_seconds=m.step_seconds,
            heldout_accuracy=m.heldout_accuracy,
        )
        for m in s.scalars(select(TrainingMetrics).order_by(TrainingMetrics.step))
    ]


def member_activity(s: Session) -> list[MemberActivity]:
    """Every member's files by state (a trained file counts as uploaded and trained, and
    keeps its verdict's state), its upload rate and its held checkpoint."""
    rows: dict[str, dict] = {
        address: {"address": address, "holds": held}
        for address, held in s.execute(
            select(Member.address, Heartbeat.policy_step)
            .outerjoin(Heartbeat, Heartbeat.address == Member.address)
            .order_by(Member.address)
        )
    }
    spans: dict[str, tuple[float, float]] = {}
    trained_flag = Submission.trained_step.is_not(None)
    for worker, state, trained, files, samples, first, last in s.execute(
        select(
            Submission.worker,
            Submission.state,
            trained_flag,
            func.count(),
            func.sum(Submission.num_samples),
            func.min(Submission.uploaded_at),
            func.max(Submission.uploaded_at),
        ).group_by(Submission.worker, Submission.state, trained_flag)
    ):
        row = rows.setdefault(worker, {"address": worker})
        row["uploaded"] = row.get("uploaded", 0) + files
        row["samples"] = row.get("samples", 0) + int(samples or 0)
        if state in ("accepted", "rejected", "voided"):
            row[state] = row.get(state, 0) + files
        if trained:
            row["trained"] = row.get("trained", 0) + files
        low, high = spans.get(worker, (first, last))
        spans[worker] = (min(low, first), max(high, last))
    for worker, (first, last) in spans.items():
        if last > first:
            rows[worker]["samples_per_second"] = rows[worker]["samples"] / (last - first)
    return [MemberActivity(**row) for row in rows.values()]


def verdict_events(s: Session) -> tuple[list[VerdictEvent], dict[str, int]]:
    newest = s.execute(
        select(Verdict.decided_at, Submission.step, Verdict.accepted, Verdict.soft, Verdict.reason)
        .join(Submission, Submission.file_hash == Verdict.file_hash)
        .order_by(Verdict.decided_at.desc())
        .limit(VERDICTS_SHOWN)
    ).all()
    events = [
        VerdictEvent(
            at=at,
            step=step,
            outcome="accepted" if accepted else "soft" if soft else "rejected",
            check=None if accepted or soft else failed_check(reason),
        )
        for at, step, accepted, soft, reason in reversed(newest)
    ]
    by_check: dict[str, int] = {}
    for (reason,) in s.execute(
        select(Verdict.reason).where(Verdict.accepted.is_(False), Verdict.soft.is_(False))
    ):
        check = failed_check(reason)
        by_check[check] = by_check.get(check, 0) + 1
    return events, by_check


def checkpoint_spread(s: Session) -> list[CheckpointSpread]:
    shown = s.scalars(
        select(Checkpoint).order_by(Checkpoint.step.desc()).limit(CHECKPOINTS_SHOWN)
    ).all()
    arrivals: dict[int, list[Arrival]] = {}
    if shown:
        announced = {c.step: c.announced_at for c in shown}
        for address, role, step, at in s.execute(
            select(
                CheckpointArrival.address, Member.role, CheckpointArrival.step, CheckpointArrival.at
            )
            .join(Member, Member.address == CheckpointArrival.address)
            .where(CheckpointArrival.step.in_(announced))
            .order_by(CheckpointArrival.at)
        ):
            arrivals.setdefault(step, []).append(
                Arrival(address=address, role=role, seconds=max(0.0, at - announced[step]))
            )
    return [
        CheckpointSpread(
            step=c.step,
            blake3=c.blake3,
            announced_at=c.announced_at,
            final=c.final,
            arrivals=arrivals.get(c.step, []),
        )
        for c in reversed(shown)
    ]


def dashboard(s: Session, status: api.PoolStatus, now: float) -> Dashboard:
    events, by_check = verdict_events(s)
    return Dashboard(
        now=now,
        status=status,
        run=run_pace(s, status),
        curves=curves(s),
        members=member_activity(s),
        verdicts=events,
        by_check=by_check,
        checkpoints=checkpoint_spread(s),
    )
