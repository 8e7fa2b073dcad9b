"""When a TOPLOC chunk passes: the thresholds and their named presets, apart from the torch
code that applies them (the run config, the validator's settings and the CLI read them
without loading torch).

``TOPLOC_PRESETS`` is the one list of presets; the run config (``validator.toploc``) and
`swarmrl validate --toploc` take their names from it. docs/validator.md gives the
measured honest worst of each figure and the margin each preset keeps over it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ToplocThresholds(BaseModel):
    """When a chunk passes TOPLOC verification (paper's bf16 values by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_exp_mismatches: int = Field(
        38,
        ge=0,
        description="Most top-k entries (out of topk) whose bf16 exponent may differ from "
        "the proof; scaled by k'/topk for a chunk with only k' < topk values.",
    )
    max_mant_err_mean: float = Field(
        10.0,
        ge=0,
        description="Largest allowed mean |mantissa difference| (7-bit mantissa units) "
        "over entries whose exponents match.",
    )
    max_mant_err_median: float = Field(
        8.0,
        ge=0,
        description="Largest allowed upper median |mantissa difference| over entries whose "
        "exponents match.",
    )


PAPER_THRESHOLDS = ToplocThresholds()

# Calibrated for fp32 workers and validators (docs/validator.md). The paper's 38/10/8
# were set for bf16 on GPUs; on fp32 they pass weights perturbed by 10% of their spread.
# Use the paper preset when workers run bf16.
FP32_TOPLOC = ToplocThresholds(max_exp_mismatches=8, max_mant_err_mean=0.5, max_mant_err_median=1.0)
PAPER_TOPLOC = PAPER_THRESHOLDS
TOPLOC_PRESETS: dict[str, ToplocThresholds] = {"fp32": FP32_TOPLOC, "paper": PAPER_TOPLOC}


def toploc_preset_help() -> str:
    """Each preset as ``name (exponent mismatches/mean/median mantissa error)``."""
    return ", ".join(
        f"{name} ({t.max_exp_mismatches}/{t.max_mant_err_mean:g}/{t.max_mant_err_median:g})"
        for name, t in TOPLOC_PRESETS.items()
    )
