"""The pool's rules, applied to the ledger: who may do what, and what each act records.

Every method is one ledger transaction under one lock: the orchestrator is a single
process, and serializing the writes keeps "issue only what the step needs" and "each
assignment returned once" true on SQLite and PostgreSQL alike. A signed request's
nonce is spent, and its sender's rate applied, in the same transaction as its act
(`signed_act`). A refused act raises `Refusal` with the HTTP status and a one-line
reason, and changes nothing but the spent nonce.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmrl.ledger import (
    Account,
    Assignment,
    Checkpoint,
    Heartbeat,
    Ledger,
    Member,
    Nonce,
    Slashing,
    Step,
    Submission,
    Verdict,
)
from swarmrl.ledger.models import LIVE_STATES
from swarmrl.orchestrator import accounts, speculation, status
from swarmrl.orchestrator.auth import Caller, RateLimiter
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.errors import Refusal, Replayed
from swarmrl.orchestrator.issuance import (
    assignment_seed,
    assignments_needed,
    chosen_for_validation,
)
from swarmrl.orchestrator.refusals import RecentRefusals
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.protocol import models as api
from swarmrl.protocol import recipe
from swarmrl.protocol.urls import unroutable
from swarmrl.rollouts import RolloutBounds, read_rollouts

log = logging.getLogger("swarmrl.orchestrator")

YIELD_WINDOW = 64  # newest submissions the claimed yield is measured over
YIELD_STEPS = 4  # newest trainer-reported steps the observed yield is measured over
LIVE = LIVE_STATES  # submissions that may still be trained
ROLES: tuple[api.Role, ...] = get_args(api.Role)
# What the trainer may train: accepted files, and pending ones not chosen for validation.
# A chosen file waits for its verdict unlisted (its claimed samples still count as coming
# in the step's need, so nothing a worker sees differs).
TRAINABLE = (Submission.state == "accepted") | (
    (Submission.state == "pending") & Submission.to_validate.is_(False)
)

# The statements of the per-request paths, built once: building a statement costs more
# than running it on SQLite.
_SPEND_NONCE = insert(Nonce)
# A new member's registration leaves a row under this name (no nonce is spelled so: they
# are hex) holding its register request's timestamp; swept with the nonces.
REGISTERED = "registered"
_REGISTERED_AT = select(Nonce.timestamp).where(
    Nonce.address == bindparam("who"), Nonce.nonce == REGISTERED
)
_KNOWN = select(Member.address).where(Member.address == bindparam("who"))
_MEMBER_STATUS = select(Member.status, Member.ejected_at).where(Member.address == bindparam("who"))
_NEWEST = select(Checkpoint.step, Checkpoint.final).order_by(Checkpoint.step.desc()).limit(1)
_HELD = select(func.count()).where(
    Assignment.worker == bindparam("who"), Assignment.state == "issued"
)
# Counted in shares (speculation.py): a re-issued share is expected once.
_OPEN_IN_STEP = speculation.OPEN_SHARES
_CLAIMED = select(func.coalesce(func.sum(Submission.num_nonzero), 0)).where(
    Submission.step == bindparam("step"), Submission.state.in_(LIVE)
)
_CLAIMED_UNREAD = _CLAIMED.where(Submission.counted.is_(False))
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
# The statements of the assignment and upload paths (`request_assignment`, `accept_upload`).
_WORKER = select(Member.role, Member.status, Member.ejected_at, Member.soft_invalidated_at).where(
    Member.address == bindparam("who")
)
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
_ISSUE = insert(Assignment).returning(Assignment.id)
_SEED = (
    update(Assignment)
    .where(Assignment.id == bindparam("assignment"))
    .values(seed=bindparam("seed_value"))
)
_STEP_FILL = select(Step.full_at, Step.target_samples).where(Step.step == bindparam("step"))
_STEP_FULL = update(Step).where(Step.step == bindparam("at_step")).values(full_at=bindparam("now"))
_BEAT = (
    update(Heartbeat)
    .where(Heartbeat.address == bindparam("who"))
    .values(last_at=bindparam("now"), beats=Heartbeat.beats + 1, policy_step=bindparam("held"))
)


@dataclass(frozen=True)
class UploadedFile:
    """A complete upload on local disk, hash and size measured while it streamed in."""

    path: Path
    file_hash: str
    size: int


def _assignment_info(a: Assignment) -> api.AssignmentInfo:
    return api.AssignmentInfo(
        id=a.id,
        worker=a.worker,
        step=a.step,
        seed=a.seed,
        prompts=a.prompts,
        group_size=a.group_size,
        deadline=a.deadline,
    )


def _submission_info(s: Submission) -> api.SubmissionInfo:
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


def read_allowlist(path: str | None) -> dict[str, set[str]]:
    """'ADDRESS ROLE' lines (blank lines and # comments allowed) → address: roles."""
    from eth_utils import is_address, to_checksum_address

    allowed: dict[str, set[str]] = {}
    if path is None:
        return allowed
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not is_address(parts[0]) or parts[1] not in ROLES:
            raise ValueError(
                f"{path}:{number}: expected 'ADDRESS ROLE' with ROLE one of "
                f"{', '.join(ROLES)}, got {line!r}"
            )
        allowed.setdefault(to_checksum_address(parts[0]), set()).add(parts[1])
    return allowed


class Pool:
    def __init__(
        self,
        config: OrchestratorConfig,
        ledger: Ledger,
        store: RolloutStore,
        secret: bytes,
        allowlist: dict[str, set[str]],
        clock: Callable[[], float] = time.time,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.store = store
        self.secret = secret
        self.allowlist = allowlist
        self.clock = clock
        self.limiter = limiter
        self._lock = threading.Lock()
        self._view: api.HeartbeatResponse | None = None  # what heartbeats answer; None = rebuild
        self.recipe = recipe.of_pool(config)
        self.refusals = RecentRefusals()

    # -- identities ---------------------------------------------------------------------

    @contextlib.contextmanager
    def signed_act(self, caller: Caller) -> Iterator[Session]:
        """The one locked transaction of a signed request's act, its nonce spent first in
        it (a replay is refused before anything else), then the sender's rate applied.

        A member's (or the owner's) request refused, or failing, after its nonce still
        spends the nonce, in a transaction of its own: no signed request is ever acted on
        twice. A stranger's refused request writes nothing, so strangers cannot fill the
        ledger; once the key registers, its requests signed before its registration's
        timestamp are refused, so what it sent as a stranger is not served later (the
        same second excepted: timestamps are whole seconds)."""
        with self._lock:
            # Checked again under the lock, on the sweep's clock: a request that waited
            # here past the window might find its first use's nonce swept already.
            if caller.timestamp < self.clock() - self.config.timestamp_window:
                raise Refusal(
                    401,
                    f"timestamp {caller.timestamp} left the ±{self.config.timestamp_window:.0f} s "
                    "window while the request waited; send it again",
                )
            try:
                with self.ledger.session() as s:
                    c = s.connection()
                    self._spend_nonce(c, caller)
                    registered = c.execute(_REGISTERED_AT, {"who": caller.address}).scalar()
                    if registered is not None and caller.timestamp < registered:
                        raise Refusal(
                            401,
                            f"signed at {caller.timestamp}, before {caller.address} registered "
                            f"(its registration was signed at {registered}): sign it anew",
                        )
                    if self.limiter is not None and not self.limiter.allow(caller.address):
                        raise Refusal(429, f"{caller.address} is over its rate limit; slow down")
                    yield s
            except Replayed:
                raise
            except BaseException:
                with self.ledger.engine.begin() as c:
                    known = caller.address == self.config.owner
                    if known or c.execute(_KNOWN, {"who": caller.address}).first():
                        self._spend_nonce(c, caller)
                raise

    @staticmethod
    def _spend_nonce(c, caller: Caller) -> None:
        try:
            c.execute(
                _SPEND_NONCE,
                {"address": caller.address, "nonce": caller.nonce, "timestamp": caller.timestamp},
            )
        except IntegrityError:  # the transaction is abandoned: the request is refused
            raise Replayed() from None

    def member(self, s: Session, address: str, roles: Iterable[str]) -> Member:
        m = s.get(Member, address)
        roles = tuple(roles)
        if m is None:
            raise Refusal(403, f"{address} is not registered")
        if m.role not in roles:
            raise Refusal(403, f"{address} is a {m.role}; this needs a {' or '.join(roles)}")
        if m.ejected_at is not None:
            raise self.ejected(s, address)
        if m.status == "dead":
            raise Refusal(
                403, f"{address} was declared dead after missed heartbeats; register again"
            )
        return m

    def _worker_row(self, s: Session, worker: str):
        """The worker's role, status and soft invalidation, by a prebuilt statement (the
        per-request paths); `member`'s precise refusal when it may not act as a worker."""
        m = s.connection().execute(_WORKER, {"who": worker}).first()
        if m is None or m.role != "worker" or m.status == "dead" or m.ejected_at is not None:
            self.member(s, worker, ["worker"])  # raises the precise refusal
            raise Refusal(403, f"{worker} may not act as a worker")  # not reached
        return m

    def ejected(self, s: Session, address: str) -> Refusal:
        """The refusal every request of an ejected member gets: `ejected: ` and why."""
        caught = s.scalars(
            select(Slashing).where(Slashing.address == address).order_by(Slashing.at.desc())
        ).first()
        why = (
            f"file {caught.file_hash} of step {caught.step} was rejected ({caught.reason}); "
            f"stake slashed by {accounts.from_units(caught.amount):g}"
            if caught
            else "a validator rejected its work"
        )
        return Refusal(403, f"ejected: {address} is out of the pool: {why}")

    def register(self, caller: Caller, req: api.RegisterRequest) -> api.Member:
        """Join (or rejoin); a refusal is also kept for the status (`refusals.py`)."""
        try:
            return self._register(caller, req)
        except Replayed:
            raise
        except Refusal as exc:
            self.refusals.record(caller.address, req.role, exc.detail, self.clock())
            raise

    def _register(self, caller: Caller, req: api.RegisterRequest) -> api.Member:
        address = caller.address
        now = self.clock()
        with self.signed_act(caller) as s:
            allowed = self.allowlist.get(address, set())
            if req.role == "worker":
                if not self.config.open_workers and "worker" not in allowed:
                    raise Refusal(403, f"{address} is not on the allowlist as a worker")
            elif req.role not in allowed:
                raise Refusal(403, f"{address} is not on the allowlist as a {req.role}")
            if req.url is not None and req.role not in ("relay", "trainer"):
                raise Refusal(422, "only relays and the trainer register a URL")
            if req.url is not None and (why := unroutable(req.url)) is not None:
                raise Refusal(422, f"url {req.url} cannot be fetched from: {why}")
            if req.recipe is not None and (diff := recipe.differences(self.recipe, req.recipe)):
                raise Refusal(409, f"recipe mismatch: {'; '.join(diff)}")
            m = s.get(Member, address)
            if m is not None and m.ejected_at is not None:
                raise self.ejected(s, address)
            if req.role == "worker" and self.config.min_stake > 0:
                self._lock_stake(s, address, now)
            if m is None:
                m = Member(
                    address=address,
                    role=req.role,
                    status="healthy",
                    url=req.url,
                    registered_at=now,
                    lapses=0,
                )
                s.add(m)
                s.flush()  # the member row first: the heartbeat row refers to it
                s.add(Heartbeat(address=address, last_at=now, beats=0))
                # What it sent refused as a stranger (no nonce kept) is never served now.
                s.add(Nonce(address=address, nonce=REGISTERED, timestamp=caller.timestamp))
            elif m.role != req.role:
                raise Refusal(409, f"{address} is registered as a {m.role}, not a {req.role}")
            else:
                m.status = "healthy"
                m.url = req.url
                s.get_one(Heartbeat, address).last_at = now
            s.flush()
            self._view = None
            acct = s.get(Account, address) or Account(balance=0, stake=0)
            return api.Member(
                address=m.address,
                role=cast(api.Role, m.role),
                status=m.status,
                url=m.url,
                lapses=m.lapses,
                balance=accounts.from_units(acct.balance),
                stake=accounts.from_units(acct.stake),
            )

    def _lock_stake(self, s: Session, address: str, now: float) -> None:
        stake = self.config.min_stake
        short = accounts.lock_stake(s, address, accounts.to_units(stake), now)
        if short:
            raise Refusal(
                402,
                f"a worker locks a stake of {stake:g} to register; {address} is "
                f"{accounts.from_units(short):g} short: ask the pool owner to fund it "
                f"(swarmrl pool fund {address} AMOUNT)",
            )

    # -- the pool owner -----------------------------------------------------------------

    def fund(self, caller: Caller, req: api.FundRequest) -> api.Account:
        from eth_utils import to_checksum_address

        owner = caller.address
        with self.signed_act(caller) as s:
            if self.config.owner is None:
                raise Refusal(403, "this pool has no owner (--owner): nobody may fund addresses")
            if owner != self.config.owner:
                raise Refusal(403, f"{owner} is not the pool owner; only {self.config.owner} funds")
            address = to_checksum_address(req.address)
            held = s.get(Account, address)
            if (held.balance if held else 0) + accounts.to_units(req.amount) > accounts.MAX_BALANCE:
                raise Refusal(
                    422,
                    f"{address} would hold over {accounts.from_units(accounts.MAX_BALANCE):g}, "
                    "the most one balance may hold",
                )
            acct = accounts.fund(s, owner, address, accounts.to_units(req.amount), self.clock())
            return api.Account(
                address=acct.address,
                balance=accounts.from_units(acct.balance),
                stake=accounts.from_units(acct.stake),
            )

    # -- heartbeats and health ----------------------------------------------------------

    def heartbeat(self, caller: Caller, req: api.HeartbeatRequest) -> api.HeartbeatResponse:
        """The hottest path (every member, every few seconds): two single-row statements,
        and the pool view from memory (rebuilt whenever what it shows may have changed)."""
        address = caller.address
        now = self.clock()
        with self.signed_act(caller) as s:
            c = s.connection()  # prebuilt Core statements: no ORM work on the hottest path
            row = c.execute(_MEMBER_STATUS, {"who": address}).first()
            status, ejected_at = row if row is not None else (None, None)
            if status is None or status == "dead" or ejected_at is not None:
                self.member(s, address, ROLES)  # raises the precise refusal
            c.execute(_BEAT, {"who": address, "now": now, "held": req.policy_step})
            if status != "healthy":
                s.execute(update(Member).where(Member.address == address).values(status="healthy"))
                self._view = None  # a relay back to health changes the relay list
            if self._view is None:
                self._view = self._pool_view(s)
            return self._view

    def _pool_view(self, s: Session) -> api.HeartbeatResponse:
        newest = s.scalars(select(Checkpoint).order_by(Checkpoint.step.desc()).limit(1)).first()
        relays = s.scalars(
            select(Member.url).where(
                Member.role == "relay", Member.status == "healthy", Member.url.is_not(None)
            )
        ).all()
        origin = s.scalars(
            select(Member.url).where(Member.role == "trainer", Member.url.is_not(None))
        ).first()
        return api.HeartbeatResponse(
            step=newest.step if newest else None,
            async_level=self.config.async_level,
            checkpoint=api.CheckpointInfo(step=newest.step, blake3=newest.blake3)
            if newest
            else None,
            relays=sorted(u for u in relays if u),
            origin=origin,
            heartbeat_seconds=self.config.heartbeat_seconds,
            finished=bool(newest and newest.final),
        )

    def sweep(self) -> None:
        """Mark members by missed heartbeats, lapse overdue assignments and the open
        assignments of dead workers (they become needed again), forget expired nonces."""
        now = self.clock()
        cfg = self.config
        # Only members whose status may change are loaded (the others beat recently and are
        # healthy), and only the assignments to lapse: the sweep holds the lock every second,
        # so its cost must not grow with the pool.
        quiet_since = now - cfg.unhealthy_after * cfg.heartbeat_seconds + 1.0  # 1 s of slack
        with self._lock, self.ledger.session() as s:
            rows = s.execute(
                select(Member, Heartbeat.last_at)
                .join(Heartbeat)
                .where(
                    Member.status != "dead",
                    (Heartbeat.last_at < quiet_since) | (Member.status != "healthy"),
                )
            ).all()
            for m, last_at in rows:
                missed = (now - last_at) / cfg.heartbeat_seconds
                status = (
                    "dead"
                    if missed >= cfg.dead_after
                    else "unhealthy"
                    if missed >= cfg.unhealthy_after
                    else "healthy"
                )
                if status != m.status and m.status != "dead":
                    m.status = status
                    self._view = None
            overdue = s.scalars(
                select(Assignment)
                .join(Member, Member.address == Assignment.worker)
                .where(
                    Assignment.state == "issued",
                    (Assignment.deadline < now) | (Member.status == "dead"),
                )
            ).all()
            for a in overdue:
                self._lapse(s, a, now)
            s.execute(delete(Nonce).where(Nonce.timestamp < now - cfg.timestamp_window - 1))

    def _lapse(self, s: Session, a: Assignment, now: float) -> None:
        a.state = "lapsed"
        a.closed_at = now
        if speculation.won(s.connection(), speculation.share_of(a.id, a.covers)):
            return  # its share came in from another worker: the pool lost nothing by it
        m = s.get_one(Member, a.worker)
        m.lapses += 1
        m.soft_invalidated_at = now  # late work: its next files are checked more often

    # -- assignments --------------------------------------------------------------------

    def _usable(self, s: Session, step: int) -> int:
        """The trainer's count for the files it has read, plus the workers' claims for
        files it has not read yet (a claim can be a lie, so it stands in only until then)."""
        row = s.get(Step, step)
        if row is None or row.trainer_usable is None:
            return int(s.scalar(_CLAIMED, {"step": step}) or 0)
        unread = s.scalar(_CLAIMED_UNREAD, {"step": step})
        return row.trainer_usable + int(unread or 0)

    def _observed_yield(self, s: Session) -> float:
        """Usable share of the samples read: the trainer's counts over its newest reported
        steps when it has reported any, the workers' claims on the newest files before."""
        reported = s.execute(_REPORTED).all()
        read = sum(r or 0 for _, r in reported)
        if read:
            return sum(u or 0 for u, _ in reported) / read
        recent = s.execute(_RECENT).all()
        samples = sum(n for _, n in recent)
        return sum(z for z, _ in recent) / samples if samples else self.config.prior_yield

    def _need(self, s: Session, step: int, observed_yield: float, now: float) -> int:
        row = s.get(Step, step)
        if row is None:
            row = Step(step=step, target_samples=self.config.batch_samples, opened_at=now)
            s.add(row)
        usable = self._usable(s, step)
        if row.trainer_full or usable >= row.target_samples:
            if row.full_at is None:
                row.full_at = now
            return 0
        open_count = s.scalar(_OPEN_IN_STEP, {"step": step})
        return assignments_needed(
            target=row.target_samples,
            usable=usable,
            open_assignments=int(open_count or 0),
            samples_per_assignment=self.config.prompts_per_assignment * self.config.group_size,
            observed_yield=observed_yield,
            surplus=self.config.surplus,
        )

    def request_assignment(
        self, caller: Caller, req: api.AssignmentRequest
    ) -> api.AssignmentResponse:
        cfg = self.config
        worker = caller.address
        now = self.clock()
        wait = cfg.heartbeat_seconds / 2
        with self.signed_act(caller) as s:
            c = s.connection()
            self._worker_row(s, worker)
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
            # The async bound allows step current + k, but samples that far ahead are
            # trained from a policy k steps old: issuing at most `max_ahead` steps past the
            # newest checkpoint keeps staleness low (at async level 2 the default run learned
            # far less when every step was filled by policy n - 2).
            last = min(min(req.policy_step, current) + cfg.async_level, current + cfg.max_ahead)
            if cfg.steps is not None:
                last = min(last, cfg.steps - 1)
            observed = self._observed_yield(s)
            waiting = []  # steps short of samples whose need the open work covers
            for step in range(current, last + 1):
                if self._need(s, step, observed, now) > 0:
                    return self._issue(c, worker, step, now)
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
                    return self._issue(c, worker, cover.step, now, covers=cover.share)
                if cover.retry_seconds is not None:  # back when the first share is overdue
                    wait = min(wait, max(cover.retry_seconds, 0.05))
            return api.AssignmentResponse(
                assignment=None,
                reason=f"steps {current}..{last} need no more work now",
                retry_seconds=wait,
            )

    def _issue(
        self, c, worker: str, step: int, now: float, covers: int | None = None
    ) -> api.AssignmentResponse:
        cfg = self.config
        a = {
            "worker": worker,
            "step": step,
            "seed": 0,
            "prompts": cfg.prompts_per_assignment,
            "group_size": cfg.group_size,
            "state": "issued",
            "issued_at": now,
            "deadline": now + cfg.assignment_seconds,
            "covers": covers,
        }
        # The id comes from the ledger; the seed from the id.
        issued = int(c.execute(_ISSUE, a).scalar_one())
        a |= {"id": issued, "seed": assignment_seed(self.secret, issued)}
        c.execute(_SEED, {"assignment": issued, "seed_value": a["seed"]})
        if covers is not None:
            log.info("assignment %d of step %d re-issues overdue share %d", issued, step, covers)
        return api.AssignmentResponse(
            assignment=api.AssignmentInfo(**{k: a[k] for k in api.AssignmentInfo.model_fields}),
            reason="",
        )

    # -- uploads ------------------------------------------------------------------------

    def open_assignment(self, s: Session, worker: str, assignment_id: int) -> Assignment:
        a = s.get(Assignment, assignment_id)
        if a is None:
            raise Refusal(404, f"assignment {assignment_id} was never issued")
        if a.worker != worker:
            raise Refusal(403, f"assignment {assignment_id} was issued to another worker")
        if a.state != "issued":
            raise Refusal(409, f"assignment {assignment_id} is {a.state}, no longer open")
        return a

    def check_upload_target(self, caller: Caller, assignment_id: int) -> None:
        """Before any byte is read (the upload's signed act; `accept_upload` finishes it):
        the sender is a worker holding this open assignment, within its deadline (a late
        one lapses now: soft, no slash, the work is void)."""
        worker = caller.address
        now = self.clock()
        with self.signed_act(caller) as s:
            self.member(s, worker, ["worker"])
            a = self.open_assignment(s, worker, assignment_id)
            if a.deadline >= now:
                return
            self._lapse(s, a, now)
        raise Refusal(
            409,
            f"assignment {assignment_id} passed its deadline {now - a.deadline:.0f} s ago; "
            "late work is void",
        )

    def _validation_fraction(self, c, worker: str, soft_invalidated_at: float | None) -> float:
        """The base rate, or the higher one for a new member's first files and the files
        after a soft invalidation of its work."""
        cfg = self.config
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

    def _upload_bounds(self, assignment_id: int) -> RolloutBounds:
        """What the assignment's file can hold: its rows exactly, each within the run's
        token limits. The strict reader checks the Parquet footer against these before it
        decodes a column, so a small file that decompresses to gigabytes costs nothing.
        Read without the lock: an issued assignment's shape never changes."""
        with self.ledger.session() as s:
            a = s.connection().execute(_ASSIGNMENT, {"id": assignment_id}).first()
        if a is None:
            raise Refusal(404, f"assignment {assignment_id} was never issued")
        return RolloutBounds(
            max_samples=a.prompts * a.group_size,
            max_new_tokens=self.config.max_new_tokens,
            max_prompt_tokens=self.config.max_prompt_tokens,
        )

    def _refused_file(self, worker: str, assignment_id: int) -> None:
        """A file refused for what it holds closes its assignment as lapsed (counted
        against the worker, its next files validated more often, the share issued again):
        each hostile file costs its sender an assignment, and none is retried forever.
        Not a slash: the refused file is not kept, so nobody else could check the verdict."""
        now = self.clock()
        with self._lock, self.ledger.session() as s:
            a = s.get(Assignment, assignment_id)
            if a is not None and a.worker == worker and a.state == "issued":
                self._lapse(s, a, now)

    def accept_upload(
        self, worker: str, assignment_id: int, upload: UploadedFile
    ) -> api.SubmissionInfo:
        """Check a streamed-in file against its assignment, store it, record the
        submission; a file refused for what it holds (422) lapses its assignment."""
        try:
            return self._accept_upload(worker, assignment_id, upload)
        except Refusal as refused:
            if refused.status == 422:
                self._refused_file(worker, assignment_id)
            raise

    def _accept_upload(
        self, worker: str, assignment_id: int, upload: UploadedFile
    ) -> api.SubmissionInfo:
        """Every upload of the pool comes through here: prebuilt Core statements, and the
        file is parsed and measured before the lock is taken."""
        cfg = self.config
        bounds = self._upload_bounds(assignment_id)
        try:
            table, meta = read_rollouts(upload.path, bounds)
        except Exception as exc:  # noqa: BLE001 (any failure to parse hostile bytes is the sender's)
            raise Refusal(422, f"unreadable rollout file: {exc}") from None
        tokens = int(
            table.column("output_tokens").combine_chunks().value_lengths().to_numpy().sum()
        )
        policies = table.column("policy_step").to_pylist()
        with self._lock, self.ledger.session() as s:
            c = s.connection()
            m = self._worker_row(s, worker)
            a = c.execute(_ASSIGNMENT, {"id": assignment_id}).first()
            if a is None or a.worker != worker or a.state != "issued":
                self.open_assignment(s, worker, assignment_id)  # raises the precise refusal
                raise Refusal(409, f"assignment {assignment_id} is not open")  # not reached
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
                        f"file metadata {field}={getattr(meta, field)!r} disagrees with "
                        f"assignment {assignment_id} ({value!r})",
                    )
            if not 0 <= meta.num_nonzero <= meta.num_samples:
                raise Refusal(422, f"file metadata num_nonzero={meta.num_nonzero} is out of range")
            if c.execute(_SUBMITTED, {"file_hash": upload.file_hash}).first() is not None:
                raise Refusal(409, f"file {upload.file_hash} was already submitted")
            name = self.store.name_for(a.step, upload.file_hash)
            now = self.clock()
            # Samples claiming a policy older than the async bound allows are of no use:
            # the file is recorded, void (soft: no slash), and its worker checked more often.
            stale = bool(policies) and min(policies) < a.step - cfg.async_level
            # Its share came in first from another worker (speculation.py): recorded void,
            # without penalty.
            lost = speculation.won(c, speculation.share_of(assignment_id, a.covers))
            sub = {
                "file_hash": upload.file_hash,
                "assignment_id": assignment_id,
                "worker": worker,
                "step": a.step,
                "stored_name": name,
                "size": upload.size,
                "num_samples": meta.num_samples,
                "num_nonzero": meta.num_nonzero,
                "num_tokens": tokens,
                "state": "voided" if stale or lost else "pending",
                "to_validate": chosen_for_validation(
                    self.secret,
                    upload.file_hash,
                    self._validation_fraction(c, worker, m.soft_invalidated_at),
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
                and self._usable(s, a.step) >= step.target_samples
            ):
                c.execute(_STEP_FULL, {"at_step": a.step, "now": now})
            # Stored last, inside the transaction: a failed store write records nothing.
            self.store.put(upload.path, name)
            return api.SubmissionInfo(
                **{k: sub[k] for k in api.SubmissionInfo.model_fields if k in sub},
                trained_step=None,
            )

    # -- the trainer --------------------------------------------------------------------

    def submissions_for_step(self, caller: Caller, step: int) -> api.SubmissionList:
        with self.signed_act(caller) as s:
            self.member(s, caller.address, ["trainer"])
            rows = s.execute(
                select(Submission, Assignment.seed)
                .join(Assignment, Assignment.id == Submission.assignment_id)
                .where(Submission.step == step, TRAINABLE)
                .order_by(Submission.uploaded_at, Submission.file_hash)
            ).all()
            return api.SubmissionList(
                step=step,
                submissions=[
                    _submission_info(r).model_copy(update={"seed": seed}) for r, seed in rows
                ],
            )

    def stored_file(self, caller: Caller, file_hash: str) -> tuple[str, int]:
        """(stored name, size) of a submission, for the trainer and validators only."""
        with self.signed_act(caller) as s:
            self.member(s, caller.address, ["trainer", "validator"])
            sub = s.get(Submission, file_hash)
            if sub is None:
                raise Refusal(404, f"no submission {file_hash}")
            return sub.stored_name, sub.size

    def submission_of(self, caller: Caller, file_hash: str) -> api.ValidationTask:
        """A submission and the assignment it answers, with the issued seed: what a
        validator needs to judge a file it already holds (`swarmrl validate
        --orchestrator`), since the seed comes from this orchestrator's secret. For the
        keys the allowlist names as validator or trainer, registered or not."""
        with self.signed_act(caller) as s:
            if not self.allowlist.get(caller.address, set()) & {"trainer", "validator"}:
                raise Refusal(
                    403, f"{caller.address} is not on the allowlist as a validator or trainer"
                )
            sub = s.get(Submission, file_hash)
            if sub is None:
                raise Refusal(404, f"no submission {file_hash}")
            a = s.get_one(Assignment, sub.assignment_id)
            return api.ValidationTask(
                submission=_submission_info(sub).model_copy(update={"seed": a.seed}),
                assignment=_assignment_info(a),
            )

    def mark_trained(self, caller: Caller, req: api.MarkTrainedRequest) -> int:
        now = self.clock()
        with self.signed_act(caller) as s:
            self.member(s, caller.address, ["trainer"])
            marked = 0
            for file_hash in dict.fromkeys(req.file_hashes):
                sub = s.get(Submission, file_hash)
                if sub is None:
                    raise Refusal(404, f"no submission {file_hash}")
                if sub.state not in LIVE:
                    raise Refusal(
                        409, f"submission {file_hash} is {sub.state}; it must not be trained"
                    )
                if sub.state == "pending" and sub.to_validate:
                    raise Refusal(
                        409,
                        f"submission {file_hash} awaits its verdict; it must not be trained yet",
                    )
                if sub.trained_step is not None:
                    if sub.trained_step != req.step:
                        raise Refusal(
                            409,
                            f"submission {file_hash} was already trained in step {sub.trained_step}",
                        )
                    continue  # the same report again (a restarted trainer): counted once
                sub.trained_step = req.step
                sub.trained_at = now
                accounts.credit(s, sub, now)  # not chosen, or accepted: counts as accepted
                marked += 1
            return marked

    def report_progress(self, caller: Caller, step: int, req: api.ProgressReport) -> api.StepStatus:
        """The trainer's own count of a step replaces the workers' claims for the files it
        names; `full` stops issuance for the step."""
        now = self.clock()
        with self.signed_act(caller) as s:
            self.member(s, caller.address, ["trainer"])
            if req.usable > req.read:
                raise Refusal(422, f"usable samples ({req.usable}) exceed those read ({req.read})")
            files = list(dict.fromkeys(req.files))
            subs = s.scalars(select(Submission).where(Submission.file_hash.in_(files))).all()
            foreign = set(files) - {x.file_hash for x in subs if x.step == step}
            if foreign:
                raise Refusal(
                    422,
                    f"{len(foreign)} files are no submissions of step {step}, e.g. "
                    f"{sorted(foreign)[0]}",
                )
            row = s.get(Step, step)
            if row is None:
                row = Step(step=step, target_samples=self.config.batch_samples, opened_at=now)
                s.add(row)
            row.trainer_usable = req.usable
            row.trainer_read = req.read
            row.trainer_full = req.full
            row.reported_at = now
            for sub in subs:
                sub.counted = True
            s.flush()
            # Full by the claims may turn out not full by the trainer's count: reopened.
            if req.full or self._usable(s, step) >= row.target_samples:
                row.full_at = row.full_at or now
            else:
                row.full_at = None
            return self._step_status(s, row)

    def announce_checkpoint(
        self, caller: Caller, req: api.CheckpointAnnouncement
    ) -> api.HeartbeatResponse:
        now = self.clock()
        with self.signed_act(caller) as s:
            self.member(s, caller.address, ["trainer"])
            known = s.get(Checkpoint, req.step)
            newest = s.scalar(select(func.max(Checkpoint.step)))
            if known is not None:
                if known.blake3 != req.blake3:
                    raise Refusal(409, f"checkpoint {req.step} was announced with another hash")
                # The trainer's word: a finished run resumed with more steps goes on.
                known.final = req.final
            elif newest is not None and req.step < newest:
                raise Refusal(409, f"checkpoint {req.step} is older than the newest ({newest})")
            else:
                s.add(
                    Checkpoint(step=req.step, blake3=req.blake3, announced_at=now, final=req.final)
                )
            s.flush()
            # Checkpoint n is the trainer's word that steps < n are trained: their credited
            # work is paid (again after a restart or a repeated announcement: nothing twice).
            self._settle(s, now)
            self._view = None
            return self._pool_view(s)

    def _rates(self) -> accounts.Rates:
        return accounts.Rates.of(self.config.pay_per_sample, self.config.pay_per_token)

    def _settle(self, s: Session, now: float) -> None:
        newest = s.scalar(select(func.max(Checkpoint.step)))
        if newest:
            accounts.settle(s, newest - 1, self._rates(), now)

    # -- the validator ------------------------------------------------------------------

    def next_for_validation(self, caller: Caller) -> api.ValidationTask:
        now = self.clock()
        with self.signed_act(caller) as s:
            self.member(s, caller.address, ["validator"])
            lease_over = now - self.config.validation_lease_seconds
            sub = s.scalars(
                select(Submission)
                .where(
                    Submission.to_validate.is_(True),
                    Submission.state == "pending",
                    (Submission.validation_claimed_at.is_(None))
                    | (Submission.validation_claimed_at < lease_over),
                )
                .order_by(Submission.uploaded_at, Submission.file_hash)
                .limit(1)
            ).first()
            if sub is None:
                return api.ValidationTask(submission=None)
            sub.validation_claimed_at = now
            a = s.get_one(Assignment, sub.assignment_id)
            return api.ValidationTask(
                submission=_submission_info(sub), assignment=_assignment_info(a)
            )

    def record_verdict(
        self, caller: Caller, req: api.VerdictRequest, *, body: str
    ) -> api.VerdictResponse:
        """Kept with the verdict: the request's body, the text its validator signed and
        the signature, so anyone can check who judged what."""
        validator = caller.address
        now = self.clock()
        with self.signed_act(caller) as s:
            self.member(s, validator, ["validator"])
            sub = s.get(Submission, req.file_hash)
            if sub is None:
                raise Refusal(404, f"no submission {req.file_hash}")
            if sub.state != "pending":
                raise Refusal(409, f"submission {req.file_hash} is already {sub.state}")
            if not sub.to_validate:
                # Unchosen files may be trained any time: a verdict could come too late.
                raise Refusal(409, f"submission {req.file_hash} was not chosen for validation")
            s.add(
                Verdict(
                    file_hash=sub.file_hash,
                    validator=validator,
                    accepted=req.accepted,
                    reason=req.reason,
                    body=body,
                    signed_text=caller.signed_text,
                    signature=caller.signature,
                    decided_at=now,
                    soft=req.soft,
                )
            )
            worker = s.get_one(Member, sub.worker)
            if req.accepted:
                sub.state = "accepted"
                accounts.credit(s, sub, now)
                self._settle(s, now)  # a verdict after its step ended is paid at once
            elif req.soft:
                sub.state = "voided"
                worker.soft_invalidated_at = now
            else:
                sub.state = "rejected"
                if worker.ejected_at is None:
                    caught = accounts.eject(
                        s, worker, sub, req.reason, self.config.slash_fraction, now
                    )
                    log.warning(
                        "worker %s ejected: file %s of step %d rejected (%s); stake slashed by "
                        "%g, %d files voided, %d trained files tainted",
                        worker.address,
                        sub.file_hash[:12],
                        sub.step,
                        req.reason,
                        accounts.from_units(caught.amount),
                        caught.voided_files,
                        caught.tainted_files,
                    )
            if not req.accepted:
                self._reopen(s, sub.step)
            return api.VerdictResponse(file_hash=sub.file_hash, state=sub.state)

    def _reopen(self, s: Session, step: int) -> None:
        """A step full by claims that a withdrawn file no longer fills needs work again."""
        s.flush()
        row = s.get(Step, step)
        if (
            row is not None
            and row.full_at is not None
            and not row.trainer_full
            and self._usable(s, step) < row.target_samples
        ):
            row.full_at = None

    # -- status -------------------------------------------------------------------------

    def _step_status(self, s: Session, row: Step) -> api.StepStatus:
        return status.step_status(s, row, self._usable(s, row.step))

    def status(self) -> api.PoolStatus:
        """Read without the lock: one session's consistent view (`status.py`)."""
        with self.ledger.session() as s:
            return status.pool_status(
                s,
                view=self._pool_view(s),
                steps=[self._step_status(s, row) for row in status.newest_steps(s)],
                recipe=self.recipe,
                rates=self._rates(),
                refusals=self.refusals.newest_first(),
            )
