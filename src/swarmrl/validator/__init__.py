"""The validator: re-check an untrusted worker's rollout file (docs/architecture.md §4.3).

The strict reader (``swarmrl.rollouts.read_rollouts``) refuses what breaks the run's
bounds; one batched prefill of the claimed checkpoint (``prefill``) recomputes what
every sampled token saw; pure checks (``checks``) compare the file with it: duplicate,
consistency, assignment, values, termination, TOPLOC, logprobs, sampling (replay and
statistical tests in ``sampling``); ``settings`` holds every threshold; ``verdict``
runs them and decides; ``cli`` is `swarmrl validate`, ``service`` the run's validator
process. See docs/validator.md.

Names are loaded on first use (PEP 562): the package imports torch, and `swarmrl`'s
argument parser imports `validator.cli` for every subcommand, which must start fast.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "CHECK_ORDER": "checks",
    "CheckFailure": "checks",
    "CheckResult": "checks",
    "FP32_TOPLOC": "settings",
    "PAPER_TOPLOC": "settings",
    "TOPLOC_PRESETS": "settings",
    "ValidatorSettings": "settings",
    "Status": "verdict",
    "UnusableInput": "verdict",
    "Verdict": "verdict",
    "judge_file": "verdict",
    "selected_for_validation": "verdict",
    "validate_file": "verdict",
    "validate_rollouts": "verdict",
}

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


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
