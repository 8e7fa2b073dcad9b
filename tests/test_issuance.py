"""How much work a step is issued (`orchestrator/issuance.py`), against hand-computed
numbers."""

from __future__ import annotations

import pytest

from swarmrl.orchestrator.issuance import assignments_needed

# 128 usable samples a step, 64 samples an assignment, 10% surplus.
STEP = {"target": 128, "samples_per_assignment": 64, "surplus": 0.1}


@pytest.mark.parametrize(
    ("usable", "open_assignments", "observed_yield", "expected"),
    [
        (0, 0, 0.5, 5),  # ceil(128 × 1.1 / 32) = 5
        (0, 2, 0.5, 3),  # the open ones count
        (64, 0, 0.25, 5),  # ceil(64 × 1.1 / 16) = 5
        (0, 0, 0.01, 44),  # the yield is floored at 0.05: ceil(140.8 / 3.2) = 44
        (128, 0, 0.5, 0),  # full
        (200, 0, 0.5, 0),
        (0, 9, 0.5, 0),  # covered by open work
    ],
)
def test_issued_to_cover_the_need_at_the_observed_yield(
    usable, open_assignments, observed_yield, expected
):
    assert (
        assignments_needed(
            usable=usable, open_assignments=open_assignments, observed_yield=observed_yield, **STEP
        )
        == expected
    )


@pytest.mark.parametrize(
    ("usable", "open_assignments", "issued", "unread", "expected"),
    [
        (0, 0, 0, 0, 4),  # the need (5) capped: 256 / 64 = 4
        (0, 2, 128, 0, 2),  # 2 open (128 samples) of the 256
        (40, 1, 200, 0, 1),  # 56 samples of room: a whole assignment, past the cap by 8
        (40, 1, 256, 0, 0),  # at the cap, work on its way: nothing
        (40, 0, 256, 64, 0),  # at the cap, a file the trainer has not read: nothing
        (40, 0, 256, 0, 1),  # all read, nothing open, the trainer still short: one
        (0, 0, 320, 0, 1),  # (every group agreed so far): one at a time
        (128, 0, 0, 0, 0),  # full stays full
    ],
)
def test_the_cap_stops_at_what_the_trainer_reads(
    usable, open_assignments, issued, unread, expected
):
    got = assignments_needed(
        usable=usable,
        open_assignments=open_assignments,
        observed_yield=0.5,
        issued_samples=issued,
        unread_samples=unread,
        max_samples=256,
        **STEP,
    )
    assert got == expected
