"""Who is in the pool: nonces, registration and stake, heartbeats, health and ejection.

Functions over a ledger session, called inside `Pool`'s lock. A signed request's nonce
is kept for the whole timestamp window (`spend_nonce`); a new member's registration
leaves a row under `REGISTERED` holding its register request's timestamp, so what the
key sent as a stranger is never served later. A member's health follows its heartbeats
(`mark_by_heartbeats`); an ejected member is refused everything, and told why.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

from sqlalchemy import Connection, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmrl.ledger import Account, Checkpoint, Heartbeat, Member, Nonce, Slashing
from swarmrl.ledger.models import CheckpointArrival
from swarmrl.orchestrator import accounts
from swarmrl.orchestrator.auth import Caller
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.errors import Refusal, Replayed
from swarmrl.protocol import models as api
from swarmrl.protocol import recipe
from swarmrl.protocol.urls import unroutable

# The statements of the per-request paths, built once: building a statement costs more
# than running it on SQLite.
_SPEND_NONCE = insert(Nonce)
# No nonce is spelled so (they are hex); swept with the nonces.
REGISTERED = "registered"
_REGISTERED_AT = select(Nonce.timestamp).where(
    Nonce.address == bindparam("who"), Nonce.nonce == REGISTERED
)
_KNOWN = select(Member.address).where(Member.address == bindparam("who"))
_MEMBER_STATUS = (
    select(Member.status, Member.ejected_at, Heartbeat.policy_step)
    .outerjoin(Heartbeat, Heartbeat.address == Member.address)
    .where(Member.address == bindparam("who"))
)
_WORKER = select(Member.role, Member.status, Member.ejected_at, Member.soft_invalidated_at).where(
    Member.address == bindparam("who")
)
_BEAT = (
    update(Heartbeat)
    .where(Heartbeat.address == bindparam("who"))
    .values(
        last_at=bindparam("now"),
        beats=Heartbeat.beats + 1,
        policy_step=bindparam("held"),
        # A beat without the figure keeps the last one reported.
        bytes_served=func.coalesce(bindparam("served"), Heartbeat.bytes_served),
    )
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
        if len(parts) != 2 or not is_address(parts[0]) or parts[1] not in api.ROLES:
            raise ValueError(
                f"{path}:{number}: expected 'ADDRESS ROLE' with ROLE one of "
                f"{', '.join(api.ROLES)}, got {line!r}"
            )
        allowed.setdefault(to_checksum_address(parts[0]), set()).add(parts[1])
    return allowed


# -- nonces ---------------------------------------------------------------------------


def spend_nonce(c: Connection, caller: Caller) -> None:
    try:
        c.execute(
            _SPEND_NONCE,
            {"address": caller.address, "nonce": caller.nonce, "timestamp": caller.timestamp},
        )
    except IntegrityError:  # the transaction is abandoned: the request is refused
        raise Replayed() from None


def registered_at(c: Connection, address: str) -> int | None:
    """The timestamp of the address's register request, if it ever registered."""
    return c.execute(_REGISTERED_AT, {"who": address}).scalar()


def is_member(c: Connection, address: str) -> bool:
    return c.execute(_KNOWN, {"who": address}).first() is not None


def forget_nonces(s: Session, before: float) -> None:
    s.execute(delete(Nonce).where(Nonce.timestamp < before))


# -- who may act ----------------------------------------------------------------------


def member(s: Session, address: str, roles: Iterable[str]) -> Member:
    """The registered, live member at `address` in one of `roles`, or the precise refusal."""
    m = s.get(Member, address)
    roles = tuple(roles)
    if m is None:
        raise Refusal(403, "not_registered", f"{address} is not registered")
    if m.role not in roles:
        raise Refusal(
            403, "wrong_role", f"{address} is a {m.role}; this needs a {' or '.join(roles)}"
        )
    if m.ejected_at is not None:
        raise ejected(s, address)
    if m.status == "dead":
        raise Refusal(
            403, "dead", f"{address} was declared dead after missed heartbeats; register again"
        )
    return m


def worker_row(s: Session, worker: str):
    """The worker's role, status and soft invalidation, by a prebuilt statement (the
    per-request paths); `member`'s precise refusal when it may not act as a worker."""
    m = s.connection().execute(_WORKER, {"who": worker}).first()
    if m is None or m.role != "worker" or m.status == "dead" or m.ejected_at is not None:
        member(s, worker, ["worker"])  # raises the precise refusal
        raise Refusal(403, "wrong_role", f"{worker} may not act as a worker")  # not reached
    return m


def ejected(s: Session, address: str) -> Refusal:
    """The refusal every request of an ejected member gets: code `ejected`, and why."""
    caught = s.scalars(
        select(Slashing).where(Slashing.address == address).order_by(Slashing.at.desc())
    ).first()
    why = (
        f"file {caught.file_hash} of step {caught.step} was rejected ({caught.reason}); "
        f"stake slashed by {accounts.from_units(caught.amount):g}"
        if caught
        else "a validator rejected its work"
    )
    return Refusal(403, "ejected", f"ejected: {address} is out of the pool: {why}")


# -- joining --------------------------------------------------------------------------


def register(
    s: Session,
    caller: Caller,
    req: api.RegisterRequest,
    *,
    config: OrchestratorConfig,
    allowlist: dict[str, set[str]],
    pool_recipe: api.Recipe,
    now: float,
) -> api.Member:
    """Join (or rejoin): workers by signature (or the allowlist), the others by the
    allowlist; a worker locks its stake."""
    address = caller.address
    allowed = allowlist.get(address, set())
    if req.role == "worker":
        if not config.open_workers and "worker" not in allowed:
            raise Refusal(403, "not_allowed", f"{address} is not on the allowlist as a worker")
    elif req.role not in allowed:
        raise Refusal(403, "not_allowed", f"{address} is not on the allowlist as a {req.role}")
    if req.url is not None and req.role not in ("relay", "trainer"):
        raise Refusal(422, "invalid", "only relays and the trainer register a URL")
    if req.url is not None and (why := unroutable(req.url)) is not None:
        raise Refusal(422, "invalid", f"url {req.url} cannot be fetched from: {why}")
    if req.recipe is not None and (diff := recipe.differences(pool_recipe, req.recipe)):
        raise Refusal(409, "recipe_mismatch", f"recipe mismatch: {'; '.join(diff)}")
    m = s.get(Member, address)
    if m is not None and m.ejected_at is not None:
        raise ejected(s, address)
    if req.role == "worker" and config.min_stake > 0:
        lock_stake(s, address, config.min_stake, now)
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
        raise Refusal(409, "wrong_role", f"{address} is registered as a {m.role}, not a {req.role}")
    else:
        m.status = "healthy"
        m.url = req.url
        s.get_one(Heartbeat, address).last_at = now
    s.flush()
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


def lock_stake(s: Session, address: str, stake: float, now: float) -> None:
    short = accounts.lock_stake(s, address, accounts.to_units(stake), now)
    if short:
        raise Refusal(
            402,
            "stake_short",
            f"a worker locks a stake of {stake:g} to register; {address} is "
            f"{accounts.from_units(short):g} short: ask the pool owner to fund it "
            f"(swarmrl pool fund {address} AMOUNT)",
        )


# -- heartbeats and health ------------------------------------------------------------


def beat(
    s: Session, address: str, policy_step: int | None, now: float, served: int | None = None
) -> bool:
    """Record a heartbeat by two single-row prebuilt statements (the hottest path: every
    member, every few seconds); True when the member came back to health."""
    c = s.connection()
    row = c.execute(_MEMBER_STATUS, {"who": address}).first()
    status, ejected_at, held_before = row if row is not None else (None, None, None)
    if status is None or status == "dead" or ejected_at is not None:
        member(s, address, api.ROLES)  # raises the precise refusal
    c.execute(_BEAT, {"who": address, "now": now, "held": policy_step, "served": served})
    # A checkpoint newly held: when it got here (the dashboard's broadcast spread). Once
    # per member and checkpoint, so the hot path writes it rarely.
    if (
        policy_step is not None
        and policy_step != held_before
        and s.get(CheckpointArrival, (address, policy_step)) is None
    ):
        s.add(CheckpointArrival(address=address, step=policy_step, at=now))
    if status != "healthy":
        s.execute(update(Member).where(Member.address == address).values(status="healthy"))
        return True
    return False


def pool_view(s: Session, config: OrchestratorConfig) -> api.HeartbeatResponse:
    """What heartbeats answer: the newest checkpoint, the healthy relays, the origin."""
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
        async_level=config.async_level,
        checkpoint=api.CheckpointInfo(step=newest.step, blake3=newest.blake3) if newest else None,
        relays=sorted(u for u in relays if u),
        origin=origin,
        heartbeat_seconds=config.heartbeat_seconds,
        finished=bool(newest and newest.final),
    )


def mark_by_heartbeats(s: Session, config: OrchestratorConfig, now: float) -> bool:
    """Mark members healthy, unhealthy or dead by their missed heartbeats; True when any
    status changed.

    Only members whose status may change are loaded (the others beat recently and are
    healthy): the sweep holds the lock every second, so its cost must not grow with the
    pool."""
    quiet_since = now - config.unhealthy_after * config.heartbeat_seconds + 1.0  # 1 s of slack
    rows = s.execute(
        select(Member, Heartbeat.last_at)
        .join(Heartbeat)
        .where(
            Member.status != "dead",
            (Heartbeat.last_at < quiet_since) | (Member.status != "healthy"),
        )
    ).all()
    changed = False
    for m, last_at in rows:
        missed = (now - last_at) / config.heartbeat_seconds
        status: api.MemberStatus = (
            "dead"
            if missed >= config.dead_after
            else "unhealthy"
            if missed >= config.unhealthy_after
            else "healthy"
        )
        if status != m.status and m.status != "dead":
            m.status = status
            changed = True
    return changed
