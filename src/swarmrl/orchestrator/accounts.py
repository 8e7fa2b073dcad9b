"""The pool's money: funding, stake, payouts and slashing, each a journal row.

Amounts are integer nano-units in the ledger (`to_units`), so the books add up exactly:
each account's balance and stake are the sums of its journal rows, and over all
accounts `balances + stakes + slashed = funded + paid out` (`check_ledger` verifies both).

- **Fund**: the pool owner adds to an address's balance (before or after it registers).
- **Stake**: a worker registering locks `min_stake` from its balance.
- **Credit and pay**: work is credited when a validator accepts its file, or when the
  trainer trains a file that was not chosen for validation. Credited work is paid into
  the worker's balance once its step has ended (the trainer announced the next
  checkpoint), at the configured rate per sample and per token; a payout names its
  file and happens at most once.
- **Slash and eject**: a rejected file takes `slash_fraction` of the worker's stake and
  returns the rest to its balance. Its files not trained yet are voided, those trained
  are recorded as tainted (with their training steps), and its unpaid credit is forfeited.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from swarmrl.ledger import (
    Account,
    Assignment,
    Checkpoint,
    Contribution,
    JournalEntry,
    Member,
    Slashing,
    Submission,
    Taint,
)
from swarmrl.orchestrator.errors import Refusal
from swarmrl.protocol import models as api

NANO = 10**9
MAX_BALANCE = 10**18  # nano-units (1e9 units): far inside the ledger's signed 64-bit integers


def to_units(amount: float) -> int:
    return round(amount * NANO)


def from_units(units: int) -> float:
    return units / NANO


@dataclass(frozen=True)
class Rates:
    """What credited work earns, in nano-units."""

    per_sample: int
    per_token: int

    @classmethod
    def of(cls, per_sample: float, per_token: float) -> Rates:
        return cls(to_units(per_sample), to_units(per_token))

    def pay(self, samples: int, tokens: int) -> int:
        return samples * self.per_sample + tokens * self.per_token


def slash_amount(stake: int, fraction: float) -> int:
    """The share of a stake taken by a slash (never more than the stake)."""
    return min(stake, round(stake * fraction))


def account(s: Session, address: str) -> Account:
    acct = s.get(Account, address)
    if acct is None:
        acct = Account(address=address, balance=0, stake=0)
        s.add(acct)
        s.flush()
    return acct


def _entry(s: Session, kind: str, address: str, amount: int, now: float, **fields) -> None:
    s.add(JournalEntry(kind=kind, address=address, amount=amount, at=now, **fields))


def fund(s: Session, owner: str, address: str, amount: int, now: float) -> Account:
    acct = account(s, address)
    acct.balance += amount
    _entry(s, "fund", address, amount, now, by=owner)
    return acct


def fund_by_owner(
    s: Session, pool_owner: str | None, owner: str, req: api.FundRequest, now: float
) -> api.Account:
    """The pool owner's act: add `req.amount` to an address's balance, up to `MAX_BALANCE`."""
    from eth_utils import to_checksum_address

    if pool_owner is None:
        raise Refusal(
            403, "not_allowed", "this pool has no owner (--owner): nobody may fund addresses"
        )
    if owner != pool_owner:
        raise Refusal(403, "not_allowed", f"{owner} is not the pool owner; only {pool_owner} funds")
    address = to_checksum_address(req.address)
    held = s.get(Account, address)
    if (held.balance if held else 0) + to_units(req.amount) > MAX_BALANCE:
        raise Refusal(
            422,
            "invalid",
            f"{address} would hold over {from_units(MAX_BALANCE):g}, the most one balance may hold",
        )
    acct = fund(s, owner, address, to_units(req.amount), now)
    return api.Account(
        address=acct.address, balance=from_units(acct.balance), stake=from_units(acct.stake)
    )


def lock_stake(s: Session, address: str, min_stake: int, now: float) -> int:
    """Top the address's stake up to `min_stake` from its balance; returns the shortfall
    (0 when locked; otherwise nothing changed)."""
    acct = account(s, address)
    missing = min_stake - acct.stake
    if missing <= 0:
        return 0
    if acct.balance < missing:
        return missing - acct.balance
    acct.balance -= missing
    acct.stake += missing
    _entry(s, "stake", address, missing, now)
    return 0


def credit(s: Session, sub: Submission, now: float) -> None:
    """Credit a submission's work to its worker (once: the file hash is the key)."""
    if s.get(Contribution, sub.file_hash) is None:
        s.add(
            Contribution(
                file_hash=sub.file_hash,
                worker=sub.worker,
                step=sub.step,
                samples=sub.num_samples,
                tokens=sub.num_tokens,
                credited_at=now,
            )
        )


def settle(s: Session, last_ended_step: int, rates: Rates, now: float) -> int:
    """Pay all credited, unpaid, unforfeited work of steps <= `last_ended_step`; returns
    the files paid. Idempotent: a step reported done again, or after a restart, pays
    nothing twice."""
    due = s.scalars(
        select(Contribution)
        .where(
            Contribution.step <= last_ended_step,
            Contribution.paid_at.is_(None),
            Contribution.forfeited_at.is_(None),
        )
        .order_by(Contribution.step, Contribution.file_hash)
    ).all()
    for c in due:
        amount = rates.pay(c.samples, c.tokens)
        c.amount = amount
        c.paid_at = now
        account(s, c.worker).balance += amount
        _entry(s, "payout", c.worker, amount, now, step=c.step, file_hash=c.file_hash)
    return len(due)


def settle_ended(s: Session, rates: Rates, now: float) -> int:
    """Pay the credited work of every ended step: checkpoint n is the trainer's word that
    the steps before n are trained."""
    newest = s.scalar(select(func.max(Checkpoint.step)))
    return settle(s, newest - 1, rates, now) if newest else 0


def eject(
    s: Session, member: Member, rejected: Submission, reason: str, fraction: float, now: float
) -> Slashing:
    """Slash, void, taint, forfeit and eject, for the rejected file `rejected`."""
    worker = member.address
    acct = account(s, worker)
    slashed = slash_amount(acct.stake, fraction)
    acct.stake -= slashed
    _entry(s, "slash", worker, slashed, now, step=rejected.step, file_hash=rejected.file_hash)
    if acct.stake:
        _entry(s, "release", worker, acct.stake, now, file_hash=rejected.file_hash)
        acct.balance += acct.stake
        acct.stake = 0
    credits = {
        c.file_hash: c
        for c in s.scalars(
            select(Contribution).where(
                Contribution.worker == worker, Contribution.paid_at.is_(None)
            )
        )
    }
    paid = set(
        s.scalars(
            select(Contribution.file_hash).where(
                Contribution.worker == worker, Contribution.paid_at.is_not(None)
            )
        )
    )
    slashing = Slashing(
        file_hash=rejected.file_hash,
        address=worker,
        step=rejected.step,
        at=now,
        reason=reason,
        amount=slashed,
        voided_files=0,
        tainted_files=0,
    )
    s.add(slashing)
    s.flush()
    others = s.scalars(
        select(Submission).where(
            Submission.worker == worker,
            Submission.state.in_(("pending", "accepted")),
            Submission.file_hash != rejected.file_hash,
        )
    ).all()
    for sub in others:
        if sub.trained_step is not None:
            s.add(
                Taint(
                    file_hash=sub.file_hash,
                    cause=rejected.file_hash,
                    worker=worker,
                    step=sub.step,
                    trained_step=sub.trained_step,
                )
            )
            slashing.tainted_files += 1
        elif sub.file_hash not in paid:
            # Paid work of an ended step stays as it is: no trainer will read it again.
            sub.state = "voided"
            slashing.voided_files += 1
        if sub.file_hash in credits:
            credits[sub.file_hash].forfeited_at = now
    member.ejected_at = now
    s.execute(
        update(Assignment)
        .where(Assignment.worker == worker, Assignment.state == "issued")
        .values(state="lapsed", closed_at=now)
    )
    return slashing


@dataclass(frozen=True)
class Money:
    balance: float = 0.0
    stake: float = 0.0
    paid: float = 0.0
    unpaid: float = 0.0


def money_by_address(s: Session, rates: Rates) -> dict[str, Money]:
    """Balance, stake, paid and unpaid (credited, at today's rates) of every address."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for a in s.scalars(select(Account)):
        totals[a.address][0] = a.balance
        totals[a.address][1] = a.stake
    for worker, paid in s.execute(
        select(Contribution.worker, func.sum(Contribution.amount))
        .where(Contribution.paid_at.is_not(None))
        .group_by(Contribution.worker)
    ):
        totals[worker][2] = int(paid or 0)
    for worker, samples, tokens in s.execute(
        select(Contribution.worker, func.sum(Contribution.samples), func.sum(Contribution.tokens))
        .where(Contribution.paid_at.is_(None), Contribution.forfeited_at.is_(None))
        .group_by(Contribution.worker)
    ):
        totals[worker][3] = rates.pay(int(samples or 0), int(tokens or 0))
    return {a: Money(*(from_units(v) for v in t)) for a, t in totals.items()}
