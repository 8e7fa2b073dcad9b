"""When a TOPLOC chunk passes: the thresholds, apart from the torch code that applies them
(the validator's settings and the CLI read them without loading torch)."""

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
