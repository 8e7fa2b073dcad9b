"""Issuing work over the ledger: how full a step is, what it still needs, and the
assignments issued for it, returned or lapsed.

Functions over a session, called inside `Pool`'s lock. The arithmetic of the need, the
seeds and the validation choice stay pure in `issuance.py`, checkable on CPU with
hand-computed numbers and by anyone holding the secret; this module applies them to the
ledger's counts. A step counts as many usable samples as the trainer counted for the
files it read, plus the workers' claims for the files it has not read yet.
"""

from __future__ import annotations

import logging
import math

from sqlalchemy import Connection, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from swarmrl.ledger import Assignment, Checkpoint, Member, Step, Submission
from swarmrl.ledger.models import LIVE_STATES, TRAINABLE, share_of
from swarmrl.orchestrator import membership, speculation
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.issuance import assignment_seed, assignments_needed
from swarmrl.protocol import models as api

log = logging.getLogger("swarmrl.orchestrator")

YIELD_WINDOW = 64  # newest submissions the claimed yield is measured over
YIELD_STEPS = 4  # newest trainer-reported steps the observed yield is measured over

_NEWEST = select(Checkpoint.step, Checkpoint.final).order_by(Checkpoint.step.desc()).limit(1)
_HELD = select(func.count()).where(
    Assignment.worker == bindparam("who"), Assignment.state == "issued"
)
# Counted in shares (speculation.py): a re-issued share is expected once.
_OPEN_IN_STEP = speculation.OPEN_SHARES
_CLAIMED = select(func.coalesce(func.sum(Submission.num_nonzero), 0)).where(
    Submission.step == bindparam("step"), Submission.state.in_(LIVE_STATES)
)
_CLAIMED_UNREAD = _CLAIMED.where(Submission.counted.is_(False))
# Samples in the files the trainer may read and has not yet (a file waiting for its
# verdict is not listed to it: it does not count toward the step's cap).
_UNREAD_SAMPLES = select(func.coalesce(func.sum(Submission.num_samples), 0)).where(
    Submission.step == bindparam("step"), TRAINABLE, Submission.counted.is_(False)
)
_REPORTED = (
    select(Step.trainer_usable, Step.trainer_read)
    .where(Step.trainer_read > 0)
    .order_by(Step.step.desc())
    .limit(YIELD_STEPS)
)
_RECENT = (
    select(Submission.num_nonzero, Submission.num_samples)
    .order_by(Submission.uploaded_at.desc())
    .limit(YIELD_WINDOW)
)
_ISSUE = insert(Assignment).returning(Assignment.id)
_SEED = (
    update(Assignment)
    .where(Assignment.id == bindparam("assignment"))
    .values(seed=bindparam("seed_value"))
)


def assignment_info(a: Assignment) -> api.AssignmentInfo:
    return api.AssignmentInfo(
        id=a.id,
        worker=a.worker,
        step=a.step,
        seed=a.seed,
        prompts=a.prompts,
        group_size=a.group_size,
        deadline=a.deadline,
    )


def usable(s: Session, step: int) -> int:
    """The trainer's count for the files it has read, plus the workers' claims for
    files it has not read yet (a claim can be a lie, so it stands in only until then)."""
    row = s.get(Step, step)
    if row is None or row.trainer_usable is None:
        return int(s.scalar(_CLAIMED, {"step": step}) or 0)
    unread = s.scalar(_CLAIMED_UNREAD, {"step": step})
    return row.trainer_usable + int(unread or 0)


def observed_yield(s: Session, prior_yield: float) -> float:
    """Usable share of the samples read: the trainer's counts over its newest reported
    steps when it has reported any, the workers' claims on the newest files before."""
    reported = s.execute(_REPORTED).all()
    read = sum(r or 0 for _, r in reported)
    if read:
        return sum(u or 0 for u, _ in reported) / read
    recent = s.execute(_RECENT).all()
    samples = sum(n for _, n in recent)
    return sum(z for z, _ in recent) / samples if samples else prior_yield


def step_row(s: Session, step: int, config: OrchestratorConfig, now: float) -> Step:
    """The step's row, opened now with the run's batch size if it has none yet."""
    row = s.get(Step, step)
    if row is None:
        row = Step(step=step, target_samples=config.batch_samples, opened_at=now)
        s.add(row)
    return row


def need(s: Session, step: int, observed: float, config: OrchestratorConfig, now: float) -> int:
    """New assignments the step still needs (0 once it is full, marked full then)."""
    row = step_row(s, step, config, now)
    in_step = usable(s, step)
    if row.trainer_full or in_step >= row.target_samples:
        if row.full_at is None:
            row.full_at = now
        return 0
    open_count = int(s.scalar(_OPEN_IN_STEP, {"step": step}) or 0)
    per_assignment = config.prompts_per_assignment * config.group_size
    cap = None
    issued = unread = 0
    if config.max_read_ratio > 0:
        # What the trainer will read of the step: what it read, what its unread files
        # hold, what the open assignments will bring. It reads no more than the cap.
        cap = math.ceil(config.max_read_ratio * row.target_samples)
        unread = int(s.scalar(_UNREAD_SAMPLES, {"step": step}) or 0)
        issued = (row.trainer_read or 0) + unread + open_count * per_assignment
    return assignments_needed(
        target=row.target_samples,
        usable=in_step,
        open_assignments=open_count,
        samples_per_assignment=per_assignment,
        observed_yield=observed,
        surplus=config.surplus,
        issued_samples=issued,
        unread_samples=unread,
        max_samples=cap,
    )


def request_assignment(
    s: Session,
    worker: str,
    req: api.AssignmentRequest,
    *,
    config: OrchestratorConfig,
    secret: bytes,
    now: float,
) -> api.AssignmentResponse:
    """An assignment of the first step within the async bound that needs work, a
    re-issued overdue share when none does (speculation.py), or why there is none."""
    cfg = config
    wait = cfg.heartbeat_seconds / 2
    c = s.connection()
    membership.worker_row(s, worker)
    newest = c.execute(_NEWEST, {}).first()
    if newest is None:
        return api.AssignmentResponse(
            assignment=None, reason="no checkpoint published yet", retry_seconds=wait
        )
    if newest.final:
        return api.AssignmentResponse(assignment=None, reason="the run is finished")
    current = newest.step
    if req.policy_step + cfg.async_level < current:
        return api.AssignmentResponse(
            assignment=None,
            reason=f"policy {req.policy_step} is too old: fetch checkpoint >= {current - cfg.async_level}",
            retry_seconds=wait,
        )
    held = s.scalar(_HELD, {"who": worker})
    if (held or 0) >= cfg.max_open_per_worker:
        return api.AssignmentResponse(
            assignment=None,
            reason=f"already holding {held} open assignments (limit {cfg.max_open_per_worker})",
            retry_seconds=wait,
        )
    # The async bound allows step current + k, but samples that far ahead are trained
    # from a policy k steps old: issuing at most `max_ahead` steps past the newest
    # checkpoint keeps staleness low (at async level 2 the default run learned far less
    # when every step was filled by policy n - 2).
    last = min(min(req.policy_step, current) + cfg.async_level, current + cfg.max_ahead)
    if cfg.steps is not None:
        last = min(last, cfg.steps - 1)
    observed = observed_yield(s, cfg.prior_yield)
    waiting = []  # steps short of samples whose need the open work covers
    for step in range(current, last + 1):
        if need(s, step, observed, cfg, now) > 0:
            return issue(c, worker, step, config=cfg, secret=secret, now=now)
        if s.get_one(Step, step).full_at is None:
            waiting.append(step)
    if cfg.speculate and not held:
        cover = speculation.share_to_cover(
            c,
            worker=worker,
            steps=waiting,
            now=now,
            heartbeat_seconds=cfg.heartbeat_seconds,
            straggler_factor=cfg.straggler_factor,
        )
        if cover.share is not None and cover.step is not None:
            return issue(
                c, worker, cover.step, config=cfg, secret=secret, now=now, covers=cover.share
            )
        if cover.retry_seconds is not None:  # back when the first share is overdue
            wait = min(wait, max(cover.retry_seconds, 0.05))
    return api.AssignmentResponse(
        assignment=None,
        reason=f"steps {current}..{last} need no more work now",
        retry_seconds=wait,
    )


def issue(
    c: Connection,
    worker: str,
    step: int,
    *,
    config: OrchestratorConfig,
    secret: bytes,
    now: float,
    covers: int | None = None,
) -> api.AssignmentResponse:
    a = {
        "worker": worker,
        "step": step,
        "seed": 0,
        "prompts": config.prompts_per_assignment,
        "group_size": config.group_size,
        "state": "issued",
        "issued_at": now,
        "deadline": now + config.assignment_seconds,
        "covers": covers,
    }
    # The id comes from the ledger; the seed from the id.
    issued = int(c.execute(_ISSUE, a).scalar_one())
    a |= {"id": issued, "seed": assignment_seed(secret, issued)}
    c.execute(_SEED, {"assignment": issued, "seed_value": a["seed"]})
    if covers is not None:
        log.info("assignment %d of step %d re-issues overdue share %d", issued, step, covers)
    return api.AssignmentResponse(
        assignment=api.AssignmentInfo(**{k: a[k] for k in api.AssignmentInfo.model_fields}),
        reason="",
    )


def lapse(s: Session, a: Assignment, now: float) -> None:
    """Close an assignment never returned: counted against its worker (its next files
    validated more often), unless its share came in from another worker."""
    a.state = "lapsed"
    a.closed_at = now
    if speculation.won(s.connection(), share_of(a.id, a.covers)):
        return  # its share came in from another worker: the pool lost nothing by it
    m = s.get_one(Member, a.worker)
    m.lapses += 1
    m.soft_invalidated_at = now  # late work: its next files are checked more often


def lapse_overdue(s: Session, now: float) -> None:
    """Lapse the assignments past their deadline and the open ones of dead workers (they
    become needed again). Only those are loaded: the sweep runs every second."""
    overdue = s.scalars(
        select(Assignment)
        .join(Member, Member.address == Assignment.worker)
        .where(
            Assignment.state == "issued",
            (Assignment.deadline < now) | (Member.status == "dead"),
        )
    ).all()
    for a in overdue:
        lapse(s, a, now)


def reopen(s: Session, step: int) -> None:
    """A step full by claims that a withdrawn file no longer fills needs work again."""
    s.flush()
    row = s.get(Step, step)
    if (
        row is not None
        and row.full_at is not None
        and not row.trainer_full
        and usable(s, step) < row.target_samples
    ):
        row.full_at = None
