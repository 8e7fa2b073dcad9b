"""The validator: re-check an untrusted worker's rollout file (docs/architecture.md §4.3).

One batched prefill of the claimed checkpoint (``prefill``) recomputes what every
sampled token saw; pure checks (``checks``) compare the file with it: consistency,
assignment, values, termination, TOPLOC, logprobs, sampling (replay and statistical
tests in ``sampling_test``); ``verdict`` runs them and decides; ``cli`` is
`swarmrl validate`. See docs/validator.md.
"""

from swarmrl.validator.checks import CHECK_ORDER, CheckFailure, CheckResult
from swarmrl.validator.verdict import (
    UnusableInput,
    ValidatorSettings,
    Verdict,
    selected_for_validation,
    validate_file,
    validate_rollouts,
)

__all__ = [
    "CHECK_ORDER",
    "CheckFailure",
    "CheckResult",
    "UnusableInput",
    "ValidatorSettings",
    "Verdict",
    "selected_for_validation",
    "validate_file",
    "validate_rollouts",
]
