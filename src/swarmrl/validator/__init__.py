"""The validator: re-check an untrusted worker's rollout file (docs/architecture.md §4.3).

The strict reader (``swarmrl.rollouts.read_rollouts``) refuses what breaks the run's
bounds; one batched prefill of the claimed checkpoint (``prefill``) recomputes what
every sampled token saw; pure checks (``checks``) compare the file with it: duplicate,
consistency, assignment, values, termination, TOPLOC, logprobs, sampling (replay and
statistical tests in ``sampling``); ``settings`` holds every threshold; ``verdict``
runs them and decides; ``cli`` is `swarmrl validate`, ``service`` the run's validator
process. See docs/validator.md.
"""

from swarmrl.validator.checks import CHECK_ORDER, CheckFailure, CheckResult
from swarmrl.validator.settings import (
    FP32_TOPLOC,
    PAPER_TOPLOC,
    TOPLOC_PRESETS,
    ValidatorSettings,
)
from swarmrl.validator.verdict import (
    Status,
    UnusableInput,
    Verdict,
    judge_file,
    selected_for_validation,
    validate_file,
    validate_rollouts,
)

__all__ = [
    "CHECK_ORDER",
    "FP32_TOPLOC",
    "PAPER_TOPLOC",
    "TOPLOC_PRESETS",
    "CheckFailure",
    "CheckResult",
    "Status",
    "UnusableInput",
    "ValidatorSettings",
    "Verdict",
    "judge_file",
    "selected_for_validation",
    "validate_file",
    "validate_rollouts",
]
