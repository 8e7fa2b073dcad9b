"""The trainer's side of the pool: the files a step may train, what it trained, its own
count of each step, its step metrics, and the checkpoints it announces.

Functions over a session, called inside `Pool`'s lock for a registered trainer. The
trainer's count of a step replaces the workers' claims for the files it names; a
checkpoint is its word that the steps before it are trained, so their credited work is
paid (`accounts.settle_ended`).
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmrl.ledger import Assignment, Checkpoint, Submission
from swarmrl.ledger.models import LIVE_STATES, TRAINABLE, TrainingMetrics
from swarmrl.orchestrator import accounts, assignments, membership, status
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.errors import Refusal
from swarmrl.orchestrator.uploads import submission_info
from swarmrl.protocol import models as api


def submissions_for_step(s: Session, trainer: str, step: int) -> api.SubmissionList:
    membership.member(s, trainer, ["trainer"])
    rows = s.execute(
        select(Submission, Assignment.seed)
        .join(Assignment, Assignment.id == Submission.assignment_id)
        .where(Submission.step == step, TRAINABLE)
        .order_by(Submission.uploaded_at, Submission.file_hash)
    ).all()
    return api.SubmissionList(
        step=step,
        submissions=[submission_info(r).model_copy(update={"seed": seed}) for r, seed in rows],
    )


def mark_trained(s: Session, trainer: str, req: api.MarkTrainedRequest, now: float) -> int:
    """Record the files trained in `req.step` and credit their work; the same report
    again (a restarted trainer) counts once. Returns the files newly marked."""
    membership.member(s, trainer, ["trainer"])
    marked = 0
    for file_hash in dict.fromkeys(req.file_hashes):
        sub = s.get(Submission, file_hash)
        if sub is None:
            raise Refusal(404, "not_found", f"no submission {file_hash}")
        if sub.state not in LIVE_STATES:
            raise Refusal(
                409, "conflict", f"submission {file_hash} is {sub.state}; it must not be trained"
            )
        if sub.state == "pending" and sub.to_validate:
            raise Refusal(
                409,
                "conflict",
                f"submission {file_hash} awaits its verdict; it must not be trained yet",
            )
        if sub.trained_step is not None:
            if sub.trained_step != req.step:
                raise Refusal(
                    409,
                    "conflict",
                    f"submission {file_hash} was already trained in step {sub.trained_step}",
                )
            continue  # the same report again (a restarted trainer): counted once
        sub.trained_step = req.step
        sub.trained_at = now
        accounts.credit(s, sub, now)  # not chosen, or accepted: counts as accepted
        marked += 1
    return marked


def report_progress(
    s: Session,
    trainer: str,
    step: int,
    req: api.ProgressReport,
    *,
    config: OrchestratorConfig,
    now: float,
) -> api.StepStatus:
    """The trainer's own count of a step replaces the workers' claims for the files it
    names; `full` stops issuance for the step."""
    membership.member(s, trainer, ["trainer"])
    if req.usable > req.read:
        raise Refusal(
            422, "invalid", f"usable samples ({req.usable}) exceed those read ({req.read})"
        )
    files = list(dict.fromkeys(req.files))
    subs = s.scalars(select(Submission).where(Submission.file_hash.in_(files))).all()
    foreign = set(files) - {x.file_hash for x in subs if x.step == step}
    if foreign:
        raise Refusal(
            422,
            "invalid",
            f"{len(foreign)} files are no submissions of step {step}, e.g. {sorted(foreign)[0]}",
        )
    row = assignments.step_row(s, step, config, now)
    row.trainer_usable = req.usable
    row.trainer_read = req.read
    row.trainer_full = req.full
    row.reported_at = now
    for sub in subs:
        sub.counted = True
    s.flush()
    # Full by the claims may turn out not full by the trainer's count: reopened.
    if req.full or assignments.usable(s, step) >= row.target_samples:
        row.full_at = row.full_at or now
    else:
        row.full_at = None
    return status.step_status(s, row, assignments.usable(s, row.step))


def announce_checkpoint(
    s: Session,
    trainer: str,
    req: api.CheckpointAnnouncement,
    *,
    rates: accounts.Rates,
    now: float,
) -> None:
    """Record a checkpoint (a known one again only with the same hash), then pay the
    credited work of the steps it ends."""
    membership.member(s, trainer, ["trainer"])
    known = s.get(Checkpoint, req.step)
    newest = s.scalar(select(func.max(Checkpoint.step)))
    if known is not None:
        if known.blake3 != req.blake3:
            raise Refusal(409, "conflict", f"checkpoint {req.step} was announced with another hash")
        # The trainer's word: a finished run resumed with more steps goes on.
        known.final = req.final
    elif newest is not None and req.step < newest:
        raise Refusal(409, "conflict", f"checkpoint {req.step} is older than the newest ({newest})")
    else:
        s.add(Checkpoint(step=req.step, blake3=req.blake3, announced_at=now, final=req.final))
    s.flush()
    # Checkpoint n is the trainer's word that steps < n are trained: their credited work
    # is paid (again after a restart or a repeated announcement: nothing twice).
    accounts.settle_ended(s, rates, now)


def record_metrics(s: Session, trainer: str, req: api.MetricsReport, now: float) -> None:
    """Keep the trainer's metrics of a trained step; a step reported again (a restarted
    trainer trained it again) replaces its row. One row per step: the table stays as
    small as the run is long."""
    membership.member(s, trainer, ["trainer"])
    row = s.get(TrainingMetrics, req.step) or TrainingMetrics(step=req.step)
    for name, value in req.model_dump().items():
        setattr(row, name, value)
    row.reported_at = now
    s.add(row)
