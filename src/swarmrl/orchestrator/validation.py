"""The validators' side of the pool: the next chosen file to judge, and the verdicts.

Functions over a session, called inside `Pool`'s lock. A chosen file is leased to one
validator at a time (`validation_lease_seconds`); its verdict is kept with the text its
validator signed. Accepted work is credited (and paid at once if its step has ended), a
soft rejection voids the file and checks its worker more often, a hard one slashes and
ejects the worker (`accounts.eject`); a withdrawn file may reopen its step.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmrl.ledger import Assignment, Member, Submission, Verdict
from swarmrl.orchestrator import accounts, assignments, membership
from swarmrl.orchestrator.auth import Caller
from swarmrl.orchestrator.errors import Refusal
from swarmrl.orchestrator.uploads import submission_info
from swarmrl.protocol import models as api

log = logging.getLogger("swarmrl.orchestrator")


def next_for_validation(
    s: Session, validator: str, *, lease_seconds: float, now: float
) -> api.ValidationTask:
    membership.member(s, validator, ["validator"])
    lease_over = now - lease_seconds
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
    sub.validation_claimed_by = validator
    a = s.get_one(Assignment, sub.assignment_id)
    return api.ValidationTask(
        submission=submission_info(sub), assignment=assignments.assignment_info(a)
    )


def release_leases(s: Session, validator: str) -> int:
    """Give back the validation leases `validator` holds on files still waiting for a
    verdict; the number given back. Called when it registers again: a validator judges
    one file at a time and holds none when it (re)starts, so a lease of its previous
    process would only keep the file, and a step waiting for it, from any validator
    until the lease ran out."""
    held = s.scalars(
        select(Submission).where(
            Submission.validation_claimed_by == validator,
            Submission.state == "pending",
        )
    ).all()
    for sub in held:
        sub.validation_claimed_at = None
        sub.validation_claimed_by = None
    if held:
        log.info("validator %s registered again: %d lease(s) given back", validator, len(held))
    return len(held)


def submission_of(
    s: Session, caller: str, file_hash: str, allowlist: dict[str, set[str]]
) -> api.ValidationTask:
    """A submission and the assignment it answers, with the issued seed: what a
    validator needs to judge a file it already holds (`swarmrl validate
    --orchestrator`), since the seed comes from this orchestrator's secret. For the
    keys the allowlist names as validator or trainer, registered or not."""
    if not allowlist.get(caller, set()) & {"trainer", "validator"}:
        raise Refusal(
            403, "not_allowed", f"{caller} is not on the allowlist as a validator or trainer"
        )
    sub = s.get(Submission, file_hash)
    if sub is None:
        raise Refusal(404, "not_found", f"no submission {file_hash}")
    a = s.get_one(Assignment, sub.assignment_id)
    return api.ValidationTask(
        submission=submission_info(sub).model_copy(update={"seed": a.seed}),
        assignment=assignments.assignment_info(a),
    )


def record_verdict(
    s: Session,
    caller: Caller,
    req: api.VerdictRequest,
    *,
    body: str,
    rates: accounts.Rates,
    slash_fraction: float,
    now: float,
) -> api.VerdictResponse:
    """Kept with the verdict: the request's body, the text its validator signed and
    the signature, so anyone can check who judged what."""
    validator = caller.address
    membership.member(s, validator, ["validator"])
    sub = s.get(Submission, req.file_hash)
    if sub is None:
        raise Refusal(404, "not_found", f"no submission {req.file_hash}")
    if sub.state != "pending":
        raise Refusal(409, "conflict", f"submission {req.file_hash} is already {sub.state}")
    if not sub.to_validate:
        # Unchosen files may be trained any time: a verdict could come too late.
        raise Refusal(409, "conflict", f"submission {req.file_hash} was not chosen for validation")
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
        accounts.settle_ended(s, rates, now)  # a verdict after its step ended is paid at once
    elif req.soft:
        sub.state = "voided"
        worker.soft_invalidated_at = now
    else:
        sub.state = "rejected"
        if worker.ejected_at is None:
            caught = accounts.eject(s, worker, sub, req.reason, slash_fraction, now)
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
        assignments.reopen(s, sub.step)
    return api.VerdictResponse(file_hash=sub.file_hash, state=sub.state)
