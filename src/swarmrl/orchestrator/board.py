"""What the dashboard shows beyond the pool status: the run's pace, the learning curves,
each member's files and held checkpoint, verdicts over time by check, and each
checkpoint's spread, read from the ledger in one session.

Read-only, like `status.py`. Every list is bounded (verdict counts of the newest
`VERDICTS_STEPS` steps, the newest `CHECKPOINTS_SHOWN` checkpoints), except the members
and the curves, which grow with the pool and the run, not with what strangers send.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmrl.ledger import Assignment, Checkpoint, Heartbeat, Member, Submission, Verdict
from swarmrl.ledger.models import CheckpointArrival, TrainingMetrics
from swarmrl.protocol import models as api

VERDICTS_STEPS = 200  # verdicts over time: the newest this many judged steps
CHECKPOINTS_SHOWN = 20
PACE_CHECKPOINTS = 10  # steps per minute over the newest this many checkpoints


class RunPace(BaseModel):
    step: int | None = Field(description="the step workers generate for")
    steps_total: int | None
    steps_per_minute: float | None = Field(description="over the newest checkpoints")
    eta_seconds: float | None = Field(description="to the last step at that pace")
    # The current step's samples; None while it has not opened (or the run is over).
    needed: int | None = Field(None, description="the current step's usable samples needed")
    issued: int | None = Field(None, description="samples the step's assignments asked for")
    uploaded: int | None = Field(None, description="samples in the step's uploaded files")
    usable: int | None = None
    trained: int | None = Field(None, description="samples of its files the trainer trained")


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
    bytes_served: int | None = Field(
        None, description="a SHARDCAST server's bytes served, as its heartbeat reports them"
    )
    reached_seconds: float | None = Field(
        None,
        description="seconds from the announcement of the checkpoint it holds to the first heartbeat that said it held it",
    )


class VerdictCount(BaseModel):
    step: int = Field(description="the judged files' step")
    outcome: str = Field(description="accepted, rejected or soft")
    check: str | None = Field(description="the failed check a reject names")
    files: int


class CheckpointSpread(BaseModel):
    """How far a checkpoint got: the members whose heartbeat said they hold it, and the
    seconds from its announcement to the first and the last of them."""

    step: int
    blake3: str
    announced_at: float
    final: bool
    held_by: dict[str, int] = Field(description="members holding it, by role")
    first_seconds: float | None
    last_seconds: float | None


class Dashboard(BaseModel):
    now: float
    status: api.PoolStatus
    run: RunPace
    curves: list[CurvePoint]
    members: list[MemberActivity]
    verdicts: list[VerdictCount] = Field(
        description=f"verdicts of the newest {VERDICTS_STEPS} judged steps, by outcome and check"
    )
    by_check: dict[str, int] = Field(description="rejects of every verdict, by failed check")
    checkpoints: list[CheckpointSpread] = Field(description="the newest, oldest first")


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
    keeps its verdict's state), its upload rate, its held checkpoint and how long that
    checkpoint took to reach it."""
    rows: dict[str, dict] = {
        address: {
            "address": address,
            "holds": held,
            "bytes_served": served,
            "reached_seconds": None
            if arrived is None or announced is None
            else max(0.0, arrived - announced),
        }
        for address, held, served, arrived, announced in s.execute(
            select(
                Member.address,
                Heartbeat.policy_step,
                Heartbeat.bytes_served,
                CheckpointArrival.at,
                Checkpoint.announced_at,
            )
            .outerjoin(Heartbeat, Heartbeat.address == Member.address)
            .outerjoin(
                CheckpointArrival,
                (CheckpointArrival.address == Member.address)
                & (CheckpointArrival.step == Heartbeat.policy_step),
            )
            .outerjoin(Checkpoint, Checkpoint.step == Heartbeat.policy_step)
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


def verdict_counts(s: Session) -> tuple[list[VerdictCount], dict[str, int]]:
    """Verdicts by step, outcome and failed check (the newest `VERDICTS_STEPS` steps), and
    all rejects by failed check. Accepts are counted in SQL; rejects are few (each one
    ejects a worker) and read one by one for the check their reason names."""
    newest = s.scalar(select(func.max(Submission.step)).join(Verdict)) or 0
    since = newest - VERDICTS_STEPS + 1
    counts: dict[tuple[int, str, str | None], int] = {}
    for step, accepted, _soft, n in s.execute(
        select(Submission.step, Verdict.accepted, Verdict.soft, func.count())
        .join(Submission, Submission.file_hash == Verdict.file_hash)
        .where(Submission.step >= since, Verdict.accepted | Verdict.soft)
        .group_by(Submission.step, Verdict.accepted, Verdict.soft)
    ):
        counts[(step, "accepted" if accepted else "soft", None)] = n
    by_check: dict[str, int] = {}
    for step, reason in s.execute(
        select(Submission.step, Verdict.reason)
        .join(Submission, Submission.file_hash == Verdict.file_hash)
        .where(Verdict.accepted.is_(False), Verdict.soft.is_(False))
    ):
        check = api.failed_check(reason)
        by_check[check] = by_check.get(check, 0) + 1
        if step >= since:
            counts[(step, "rejected", check)] = counts.get((step, "rejected", check), 0) + 1
    shown = [
        VerdictCount(step=step, outcome=outcome, check=check, files=n)
        for (step, outcome, check), n in sorted(
            counts.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
        )
    ]
    return shown, by_check


def checkpoint_spread(s: Session) -> list[CheckpointSpread]:
    shown = s.scalars(
        select(Checkpoint).order_by(Checkpoint.step.desc()).limit(CHECKPOINTS_SHOWN)
    ).all()
    roles: dict[int, dict[str, int]] = {}
    span: dict[int, tuple[float, float]] = {}
    if shown:
        for role, step, n, earliest, latest in s.execute(
            select(
                Member.role,
                CheckpointArrival.step,
                func.count(),
                func.min(CheckpointArrival.at),
                func.max(CheckpointArrival.at),
            )
            .join(Member, Member.address == CheckpointArrival.address)
            .where(CheckpointArrival.step.in_([c.step for c in shown]))
            .group_by(Member.role, CheckpointArrival.step)
        ):
            roles.setdefault(step, {})[role] = n
            low, high = span.get(step, (earliest, latest))
            span[step] = (min(low, earliest), max(high, latest))
    spread = []
    for c in reversed(shown):
        first, last = span.get(c.step) or (None, None)
        spread.append(
            CheckpointSpread(
                step=c.step,
                blake3=c.blake3,
                announced_at=c.announced_at,
                final=c.final,
                held_by=roles.get(c.step, {}),
                first_seconds=None if first is None else max(0.0, first - c.announced_at),
                last_seconds=None if last is None else max(0.0, last - c.announced_at),
            )
        )
    return spread


def dashboard(s: Session, status: api.PoolStatus, now: float) -> Dashboard:
    verdicts, by_check = verdict_counts(s)
    return Dashboard(
        now=now,
        status=status,
        run=run_pace(s, status),
        curves=curves(s),
        members=member_activity(s),
        verdicts=verdicts,
        by_check=by_check,
        checkpoints=checkpoint_spread(s),
    )
