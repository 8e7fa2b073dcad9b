"""How much work to issue, and the secrets that make it ungameable: pure functions.

An assignment's seed is HMAC-SHA256(secret, "assignment|<id>"): the id comes from the
ledger and the secret never leaves the orchestrator, so a worker can neither choose
nor predict nor grind its prompts. A file is chosen for validation when
HMAC(secret, "validate|<file hash>") falls below the validation fraction, which a
worker cannot compute either.

Kept free of the ledger, so the math is checked on CPU with hand-computed numbers and
anyone holding the secret can recompute a seed; `assignments.py` applies it to the
ledger's counts.
"""

from __future__ import annotations

import hashlib
import hmac
import math

SEED_BITS = 63  # fits a signed 64-bit ledger column


def assignment_seed(secret: bytes, assignment_id: int) -> int:
    digest = hmac.new(secret, f"assignment|{assignment_id}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def chosen_for_validation(secret: bytes, file_hash: str, fraction: float) -> bool:
    digest = hmac.new(secret, f"validate|{file_hash}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def assignments_needed(
    *,
    target: int,
    usable: int,
    open_assignments: int,
    samples_per_assignment: int,
    observed_yield: float,
    surplus: float,
    issued_samples: int = 0,
    unread_samples: int = 0,
    max_samples: int | None = None,
) -> int:
    """New assignments a step still needs (the caller asks only while the trainer has
    not said the step is full).

    `usable` samples are in; each open assignment is expected to bring
    `samples_per_assignment × observed_yield` more. Issue enough to cover what is
    missing plus a `surplus` share, and nothing once the step is full.

    `max_samples` caps the step's work: `issued_samples` (what the trainer read, the
    `unread_samples` of files it may read and has not, and what the open assignments
    will bring) goes up to it and, being issued in whole assignments, past it by less
    than one, so a trainer that stops reading at `max_samples` always gets there. Past
    the cap the step is issued one assignment at a time, and only once the trainer has
    read everything there is and nothing is open: a trainer still short of its batch
    (every group so far agreeing, or its own read cap set higher) never waits for work
    nobody was given.
    """
    missing = target - usable
    if missing <= 0:
        return 0
    per_assignment = samples_per_assignment * max(observed_yield, 0.05)
    wanted = max(math.ceil(missing * (1 + surplus) / per_assignment) - open_assignments, 0)
    if max_samples is None:
        return wanted
    room = math.ceil((max_samples - issued_samples) / samples_per_assignment)
    if room > 0:
        return min(wanted, room)
    return 1 if open_assignments == 0 and unread_samples == 0 else 0
