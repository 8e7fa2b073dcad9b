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
) -> int:
    """New assignments a step still needs.

    `usable` samples are in; each open assignment is expected to bring
    `samples_per_assignment × observed_yield` more. Issue enough to cover what is
    missing plus a `surplus` share, and nothing once the step is full.
    """
    missing = target - usable
    if missing <= 0:
        return 0
    per_assignment = samples_per_assignment * max(observed_yield, 0.05)
    wanted = math.ceil(missing * (1 + surplus) / per_assignment)
    return max(wanted - open_assignments, 0)
