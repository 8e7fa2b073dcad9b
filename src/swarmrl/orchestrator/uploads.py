"""A worker's file coming in: checked against its assignment, stored, recorded.

Worker data is hostile input. Before any byte is read, the sender must hold the open
assignment within its deadline, its share not already won by another worker's file
(`check_target`); the file is then parsed against the
assignment's exact bounds (`bounds`) before the pool's lock is taken, and recorded
under it (`record`). A file refused for what it holds lapses its assignment
(`refused_file`): each hostile file costs its sender an assignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from swarmrl.ledger import Assignment, Member, Step, Submission
from swarmrl.ledger.models import share_of
from swarmrl.orchestrator import assignments, membership, speculation
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.errors import Refusal
from swarmrl.orchestrator.issuance import chosen_for_validation
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.protocol import models as api
from swarmrl.rollouts import RolloutBounds, RolloutMeta, read_rollouts

_ASSIGNMENT = select(
    Assignment.worker,
    Assignment.state,
    Assignment.step,
    Assignment.prompts,
    Assignment.group_size,
    Assignment.covers,
).where(Assignment.id == bindparam("id"))
_SUBMITTED = select(Submission.file_hash).where(Submission.file_hash == bindparam("file_hash"))
_FILES_OF = select(func.count()).where(Submission.worker == bindparam("who"))
_FILES_SINCE = _FILES_OF.where(Submission.uploaded_at > bindparam("since"))
_RECORD = insert(Submission)
_RETURNED = (
    update(Assignment)
    .where(Assignment.id == bindparam("assignment"))
    .values(state="returned", closed_at=bindparam("now"))
)
_SOFT_INVALIDATED = (
    update(Member)
    .where(Member.address == bindparam("who"))
    .values(soft_invalidated_at=bindparam("now"))
)
_STEP_FILL = select(Step.full_at, Step.target_samples).where(Step.step == bindparam("step"))
_STEP_FULL = update(Step).where(Step.step == bindparam("at_step")).values(full_at=bindparam("now"))


@dataclass(frozen=True)
class UploadedFile:
    """A complete upload on local disk, hash and size measured while it streamed in."""

    path: Path
    file_hash: str
    size: int


@dataclass(frozen=True)
class ParsedFile:
    """What the strict reader found in an upload, measured before the lock is taken."""

    meta: RolloutMeta
    tokens: int
    policies: list[int]


def submission_info(s: Submission) -> api.SubmissionInfo:
    return api.SubmissionInfo(
        file_hash=s.file_hash,
        assignment_id=s.assignment_id,
        worker=s.worker,
        step=s.step,
        size=s.size,
        num_samples=s.num_samples,
        num_nonzero=s.num_nonzero,
        num_tokens=s.num_tokens,
        state=s.state,
        trained_step=s.trained_step,
    )


def open_assignment(s: Session, worker: str, assignment_id: int) -> Assignment:
    a = s.get(Assignment, assignment_id)
    if a is None:
        raise Refusal(404, "not_found", f"assignment {assignment_id} was never issued")
    if a.worker != worker:
        raise Refusal(
            403, "not_allowed", f"assignment {assignment_id} was issued to another worker"
        )
    if a.state != "issued":
        raise Refusal(409, "conflict", f"assignment {assignment_id} is {a.state}, no longer open")
    return a


def check_target(s: Session, worker: str, assignment_id: int, now: float) -> Refusal | None:
    """The sender is a worker holding this open assignment; a late one, or one whose
    share another worker's file already won (speculation.py), lapses now (soft, no
    slash, the work is void) and the refusal to raise once that is committed is
    returned. Both are known from the ledger alone, so the body is never read."""
    membership.member(s, worker, ["worker"])
    a = open_assignment(s, worker, assignment_id)
    share = share_of(a.id, a.covers)
    if speculation.won(s.connection(), share):
        assignments.lapse(s, a, now)  # without penalty: the share came in
        return Refusal(
            409,
            "conflict",
            f"assignment {assignment_id} is void: another worker's file for its share "
            f"(assignment {share}) came in first; no penalty",
        )
    if a.deadline >= now:
        return None
    assignments.lapse(s, a, now)
    return Refusal(
        409,
        "late",
        f"assignment {assignment_id} passed its deadline {now - a.deadline:.0f} s ago; "
        "late work is void",
    )


def bounds(s: Session, assignment_id: int, config: OrchestratorConfig) -> RolloutBounds:
    """What the assignment's file can hold: its rows exactly, each within the run's token
    limits. The strict reader checks the Parquet footer against these before it decodes
    a column, so a small file that decompresses to gigabytes costs nothing. Needs no
    lock: an issued assignment's shape never changes."""
    a = s.connection().execute(_ASSIGNMENT, {"id": assignment_id}).first()
    if a is None:
        raise Refusal(404, "not_found", f"assignment {assignment_id} was never issued")
    return RolloutBounds(
        max_samples=a.prompts * a.group_size,
        max_new_tokens=config.max_new_tokens,
        max_prompt_tokens=config.max_prompt_tokens,
    )


def parse(upload: UploadedFile, limits: RolloutBounds) -> ParsedFile:
    try:
        table, meta = read_rollouts(upload.path, limits)
    except Exception as exc:  # noqa: BLE001 (any failure to parse hostile bytes is the sender's)
        raise Refusal(422, "bad_file", f"unreadable rollout file: {exc}") from None
    tokens = int(table.column("output_tokens").combine_chunks().value_lengths().to_numpy().sum())
    return ParsedFile(meta=meta, tokens=tokens, policies=table.column("policy_step").to_pylist())


def refused_file(s: Session, worker: str, assignment_id: int, now: float) -> None:
    """A file refused for what it holds closes its assignment as lapsed (counted against
    the worker, its next files validated more often, the share issued again): none is
    retried forever. Not a slash: the refused file is not kept, so nobody else could
    check the verdict."""
    a = s.get(Assignment, assignment_id)
    if a is not None and a.worker == worker and a.state == "issued":
        assignments.lapse(s, a, now)


def validation_fraction(
    c, config: OrchestratorConfig, worker: str, soft_invalidated_at: float | None
) -> float:
    """The base rate, or the higher one for a new member's first files and the files
    after a soft invalidation of its work."""
    cfg = config
    if (
        cfg.validation_fraction == 0
        or cfg.new_member_validation_fraction <= cfg.validation_fraction
    ):
        return cfg.validation_fraction
    if int(c.execute(_FILES_OF, {"who": worker}).scalar() or 0) < cfg.new_member_files:
        return cfg.new_member_validation_fraction
    if soft_invalidated_at is not None:
        since = c.execute(_FILES_SINCE, {"who": worker, "since": soft_invalidated_at})
        if int(since.scalar() or 0) < cfg.soft_invalidation_files:
            return cfg.new_member_validation_fraction
    return cfg.validation_fraction


def record(
    s: Session,
    worker: str,
    assignment_id: int,
    upload: UploadedFile,
    parsed: ParsedFile,
    *,
    config: OrchestratorConfig,
    secret: bytes,
    store: RolloutStore,
    now: float,
) -> api.SubmissionInfo:
    """Check a parsed file against its open assignment, record the submission, return
    the assignment and store the file: every upload of the pool comes through here, by
    prebuilt Core statements."""
    cfg = config
    meta = parsed.meta
    c = s.connection()
    m = membership.worker_row(s, worker)
    a = c.execute(_ASSIGNMENT, {"id": assignment_id}).first()
    if a is None or a.worker != worker or a.state != "issued":
        open_assignment(s, worker, assignment_id)  # raises the precise refusal
        raise Refusal(409, "conflict", f"assignment {assignment_id} is not open")  # not reached
    expected = {
        "worker_address": worker,
        "step": a.step,
        "submission": assignment_id,
        "num_samples": a.prompts * a.group_size,
    }
    if cfg.run_id is not None:
        expected["run_id"] = cfg.run_id
    for field, value in expected.items():
        if getattr(meta, field) != value:
            raise Refusal(
                422,
                "bad_file",
                f"file metadata {field}={getattr(meta, field)!r} disagrees with "
                f"assignment {assignment_id} ({value!r})",
            )
    if not 0 <= meta.num_nonzero <= meta.num_samples:
        raise Refusal(
            422, "bad_file", f"file metadata num_nonzero={meta.num_nonzero} is out of range"
        )
    if c.execute(_SUBMITTED, {"file_hash": upload.file_hash}).first() is not None:
        raise Refusal(409, "conflict", f"file {upload.file_hash} was already submitted")
    name = store.name_for(a.step, upload.file_hash)
    # Samples claiming a policy older than the async bound allows are of no use: the
    # file is recorded, void (soft: no slash), and its worker checked more often.
    stale = bool(parsed.policies) and min(parsed.policies) < a.step - cfg.async_level
    # Its share came in first from another worker (speculation.py): recorded void,
    # without penalty.
    lost = speculation.won(c, share_of(assignment_id, a.covers))
    sub = {
        "file_hash": upload.file_hash,
        "assignment_id": assignment_id,
        "worker": worker,
        "step": a.step,
        "stored_name": name,
        "size": upload.size,
        "num_samples": meta.num_samples,
        "num_nonzero": meta.num_nonzero,
        "num_tokens": parsed.tokens,
        "state": "voided" if stale or lost else "pending",
        "to_validate": chosen_for_validation(
            secret,
            upload.file_hash,
            validation_fraction(c, cfg, worker, m.soft_invalidated_at),
        ),
        "uploaded_at": now,
        "counted": False,
    }
    c.execute(_RECORD, sub)
    c.execute(_RETURNED, {"assignment": assignment_id, "now": now})
    if stale:
        c.execute(_SOFT_INVALIDATED, {"who": worker, "now": now})
    step = c.execute(_STEP_FILL, {"step": a.step}).first()
    if (
        step is not None
        and step.full_at is None
        and assignments.usable(s, a.step) >= step.target_samples
    ):
        c.execute(_STEP_FULL, {"at_step": a.step, "now": now})
    # Stored last, inside the transaction: a failed store write records nothing.
    store.put(upload.path, name)
    return api.SubmissionInfo(
        **{k: sub[k] for k in api.SubmissionInfo.model_fields if k in sub},
        trained_step=None,
    )


def stored_file(s: Session, caller_address: str, file_hash: str) -> tuple[str, int]:
    """(stored name, size) of a submission, for the trainer and validators only."""
    membership.member(s, caller_address, ["trainer", "validator"])
    sub = s.get(Submission, file_hash)
    if sub is None:
        raise Refusal(404, "not_found", f"no submission {file_hash}")
    return sub.stored_name, sub.size
