"""The ledger's tables: everything the pool must not forget when the orchestrator restarts.

Times are unix seconds (float). Addresses are EIP-55 checksummed strings. A submission
is keyed by the SHA-256 of its file; each issued assignment is returned at most once.
Money (balances, stakes, payouts, slashes) is kept in integer nano-units (1e-9 of the
pool's unit) so the books add up exactly: every movement is a journal row, and each
account's balance and stake are what its journal rows sum to.
"""

from __future__ import annotations

from typing import Literal, get_args

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from swarmrl.protocol.models import (
    ASSIGNMENT_STATES,
    MEMBER_STATUSES,
    ROLES,
    SUBMISSION_STATES,
    AssignmentState,
    MemberStatus,
    Role,
    SubmissionState,
)

LIVE_STATES: tuple[SubmissionState, ...] = ("pending", "accepted")  # may still be trained
# fund: owner → balance; stake: balance → stake; release: stake → balance;
# slash: stake → gone (the pool keeps it); payout: pool → balance.
JournalKind = Literal["fund", "stake", "release", "slash", "payout"]
JOURNAL_KINDS: tuple[JournalKind, ...] = get_args(JournalKind)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    pass


class Member(Base):
    """A registered identity and its role; `status` follows its heartbeats."""

    __tablename__ = "members"
    __table_args__ = (
        CheckConstraint(_one_of("role", ROLES), name="ck_members_role"),
        CheckConstraint(_one_of("status", MEMBER_STATUSES), name="ck_members_status"),
    )

    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    role: Mapped[Role] = mapped_column(String(16))
    status: Mapped[MemberStatus] = mapped_column(String(16))
    url: Mapped[str | None] = mapped_column(String(512))
    registered_at: Mapped[float] = mapped_column(Float)
    lapses: Mapped[int] = mapped_column(Integer, default=0)
    # Set when a validator rejected its work: no assignments, uploads or heartbeats since.
    ejected_at: Mapped[float | None] = mapped_column(Float)
    # Its newest soft invalidation (a lapse, stale or unverifiable work): its next files
    # are validated at the higher rate.
    soft_invalidated_at: Mapped[float | None] = mapped_column(Float)


class Heartbeat(Base):
    """The newest heartbeat of each member, and how many it has sent."""

    __tablename__ = "heartbeats"

    address: Mapped[str] = mapped_column(ForeignKey("members.address"), primary_key=True)
    last_at: Mapped[float] = mapped_column(Float)
    beats: Mapped[int] = mapped_column(Integer, default=0)
    policy_step: Mapped[int | None] = mapped_column(Integer)
    # A SHARDCAST server's (a relay's, the trainer's origin's) own count of the bytes it
    # has served since it started: a claim, shown on the dashboard as reported.
    bytes_served: Mapped[int | None] = mapped_column(BigInteger)


class Nonce(Base):
    """A nonce an address has used; kept until its request's timestamp leaves the window."""

    __tablename__ = "nonces"

    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(128), primary_key=True)
    timestamp: Mapped[int] = mapped_column(BigInteger, index=True)


class Checkpoint(Base):
    """A policy checkpoint the trainer published: step n and the BLAKE3 of its file."""

    __tablename__ = "checkpoints"

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    blake3: Mapped[str] = mapped_column(String(64))
    announced_at: Mapped[float] = mapped_column(Float)
    final: Mapped[bool] = mapped_column(Boolean, default=False)


class Step(Base):
    """A rollout step: how many usable samples it needs, and whether it is full.

    Once the trainer reports its own count (`trainer_*`), that count replaces the
    workers' claims for the files it counted: a worker's `num_nonzero` can be a lie.
    """

    __tablename__ = "steps"

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_samples: Mapped[int] = mapped_column(Integer)
    opened_at: Mapped[float] = mapped_column(Float)
    full_at: Mapped[float | None] = mapped_column(Float)
    trainer_usable: Mapped[int | None] = mapped_column(Integer)
    trainer_read: Mapped[int | None] = mapped_column(Integer)
    trainer_full: Mapped[bool] = mapped_column(Boolean, default=False)
    reported_at: Mapped[float | None] = mapped_column(Float)


class Assignment(Base):
    """Work issued to one worker for one step; its seed is HMAC(secret, id)."""

    __tablename__ = "assignments"
    __table_args__ = (
        CheckConstraint(_one_of("state", ASSIGNMENT_STATES), name="ck_assignments_state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    worker: Mapped[str] = mapped_column(ForeignKey("members.address"), index=True)
    step: Mapped[int] = mapped_column(Integer, index=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    prompts: Mapped[int] = mapped_column(Integer)
    group_size: Mapped[int] = mapped_column(Integer)
    state: Mapped[AssignmentState] = mapped_column(String(16), index=True)
    issued_at: Mapped[float] = mapped_column(Float)
    deadline: Mapped[float] = mapped_column(Float)
    closed_at: Mapped[float | None] = mapped_column(Float)
    # A speculative re-issue: the id of the open assignment whose share this one covers
    # (its holder fell silent or lagged). Of the two, the first good upload counts; the
    # other's file is voided, without penalty to either worker.
    covers: Mapped[int | None] = mapped_column(Integer, index=True)


def share_of(assignment_id: int, covers: int | None) -> int:
    """The share an assignment fills: its own id, or the id of the assignment it
    re-issues (`covers`). Of a share's assignments at most one file counts."""
    return assignment_id if covers is None else covers


# `share_of` in SQL, for the queries that count or match shares (the ledger's tests check
# that the two agree on every row).
SHARE = func.coalesce(Assignment.covers, Assignment.id)


class Submission(Base):
    """An uploaded rollout file, keyed by its SHA-256, for one issued assignment."""

    __tablename__ = "submissions"
    __table_args__ = (
        CheckConstraint(_one_of("state", SUBMISSION_STATES), name="ck_submissions_state"),
        UniqueConstraint("assignment_id", name="uq_submissions_assignment"),
        # A step's live claims (the orchestrator sums them on every assignment and upload),
        # answered from the index alone.
        Index("ix_submissions_step_claims", "step", "state", "counted", "num_nonzero"),
    )

    file_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    assignment_id: Mapped[int] = mapped_column(ForeignKey("assignments.id"))
    worker: Mapped[str] = mapped_column(ForeignKey("members.address"), index=True)
    step: Mapped[int] = mapped_column(Integer, index=True)
    stored_name: Mapped[str] = mapped_column(String(256), unique=True)
    size: Mapped[int] = mapped_column(BigInteger)
    num_samples: Mapped[int] = mapped_column(Integer)
    num_nonzero: Mapped[int] = mapped_column(Integer)
    num_tokens: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[SubmissionState] = mapped_column(String(16), index=True)
    to_validate: Mapped[bool] = mapped_column(Boolean)
    validation_claimed_at: Mapped[float | None] = mapped_column(Float)
    # The validator holding the lease: its next registration (a restarted process) gives
    # the lease back rather than leave the file waiting out validation_lease_seconds.
    validation_claimed_by: Mapped[str | None] = mapped_column(String(42))
    uploaded_at: Mapped[float] = mapped_column(Float, index=True)
    trained_step: Mapped[int | None] = mapped_column(Integer)
    trained_at: Mapped[float | None] = mapped_column(Float)
    # The trainer has read this file and its samples are in the step's trainer count.
    counted: Mapped[bool] = mapped_column(Boolean, default=False)


# What the trainer may train: accepted files, and pending ones not chosen for validation.
# A chosen file waits for its verdict unlisted (its claimed samples still count as coming
# in the step's need, so nothing a worker sees differs).
TRAINABLE = (Submission.state == "accepted") | (
    (Submission.state == "pending") & Submission.to_validate.is_(False)
)


class Verdict(Base):
    """A validator's signed judgement of one submission."""

    __tablename__ = "verdicts"

    file_hash: Mapped[str] = mapped_column(ForeignKey("submissions.file_hash"), primary_key=True)
    validator: Mapped[str] = mapped_column(ForeignKey("members.address"))
    accepted: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)
    # The request that carried the verdict, as signed: anyone can re-check who decided.
    body: Mapped[str] = mapped_column(Text)
    signed_text: Mapped[str] = mapped_column(Text)
    signature: Mapped[str] = mapped_column(String(132))
    decided_at: Mapped[float] = mapped_column(Float)
    # Not judged through no proven fault of the worker (its checkpoint was pruned): the
    # file is voided, nobody slashed.
    soft: Mapped[bool] = mapped_column(Boolean, default=False)


class Contribution(Base):
    """Work credited to a worker: one row per submission accepted by a validator, or
    trained without having been chosen for validation. Paid once its step has ended;
    forfeited if the worker is ejected before that."""

    __tablename__ = "contributions"

    file_hash: Mapped[str] = mapped_column(ForeignKey("submissions.file_hash"), primary_key=True)
    worker: Mapped[str] = mapped_column(ForeignKey("members.address"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)
    credited_at: Mapped[float] = mapped_column(Float)
    paid_at: Mapped[float | None] = mapped_column(Float)
    amount: Mapped[int | None] = mapped_column(BigInteger)  # nano-units paid
    forfeited_at: Mapped[float | None] = mapped_column(Float)


class Account(Base):
    """The funds of one address (funded before it registers, so not tied to a member)."""

    __tablename__ = "accounts"

    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    balance: Mapped[int] = mapped_column(BigInteger, default=0)
    stake: Mapped[int] = mapped_column(BigInteger, default=0)


class JournalEntry(Base):
    """One movement of funds. A payout and a slash name their file: each happens once."""

    __tablename__ = "journal"
    __table_args__ = (
        CheckConstraint(_one_of("kind", JOURNAL_KINDS), name="ck_journal_kind"),
        CheckConstraint("amount >= 0", name="ck_journal_amount"),
        UniqueConstraint("kind", "file_hash", name="uq_journal_kind_file"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[JournalKind] = mapped_column(String(16))
    address: Mapped[str] = mapped_column(String(42), index=True)
    amount: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int | None] = mapped_column(Integer)
    file_hash: Mapped[str | None] = mapped_column(String(64))
    by: Mapped[str | None] = mapped_column(String(42))  # the owner who funded


class Slashing(Base):
    """A worker caught by a rejected file: what it lost and the exposure it left."""

    __tablename__ = "slashings"

    file_hash: Mapped[str] = mapped_column(ForeignKey("submissions.file_hash"), primary_key=True)
    address: Mapped[str] = mapped_column(ForeignKey("members.address"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    amount: Mapped[int] = mapped_column(BigInteger)
    voided_files: Mapped[int] = mapped_column(Integer)
    tainted_files: Mapped[int] = mapped_column(Integer)


class Taint(Base):
    """A file of a caught worker that was already trained: the exposure, by step."""

    __tablename__ = "taints"

    file_hash: Mapped[str] = mapped_column(ForeignKey("submissions.file_hash"), primary_key=True)
    cause: Mapped[str] = mapped_column(ForeignKey("slashings.file_hash"), index=True)
    worker: Mapped[str] = mapped_column(String(42))
    step: Mapped[int] = mapped_column(Integer)
    trained_step: Mapped[int] = mapped_column(Integer)


class TrainingMetrics(Base):
    """The trainer's report of one trained rollout step (what its `metrics.jsonl` holds, in
    part): the learning curves the dashboard draws. A step reported again replaces its row
    (a restarted trainer trains the step again)."""

    __tablename__ = "training_metrics"

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    reported_at: Mapped[float] = mapped_column(Float)
    reward: Mapped[float | None] = mapped_column(Float)
    task_reward: Mapped[float | None] = mapped_column(Float)
    length_error: Mapped[float | None] = mapped_column(Float)  # None: no length targets
    grad_norm: Mapped[float | None] = mapped_column(Float)
    clip_ratio: Mapped[float | None] = mapped_column(Float)
    entropy: Mapped[float | None] = mapped_column(Float)
    staleness_mean: Mapped[float] = mapped_column(Float)
    staleness_max: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    step_seconds: Mapped[float] = mapped_column(Float)
    heldout_accuracy: Mapped[float | None] = mapped_column(Float)  # where evaluated


class CheckpointArrival(Base):
    """When a member first said in a heartbeat that it holds checkpoint `step`: the spread
    of each checkpoint through relays and workers."""

    __tablename__ = "checkpoint_arrivals"

    address: Mapped[str] = mapped_column(ForeignKey("members.address"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
