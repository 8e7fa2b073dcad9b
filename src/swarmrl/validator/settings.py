"""How strict the validator is: every threshold.

docs/validator.md gives the measured honest worst of each figure and the margin each
threshold keeps over it. The named TOPLOC presets (``TOPLOC_PRESETS``) live with the
thresholds in ``swarmrl.toploc.thresholds``, one floor below the run config and the
validator, and are re-exported here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from swarmrl.toploc.thresholds import (
    FP32_TOPLOC,
    PAPER_TOPLOC,
    TOPLOC_PRESETS,
    ToplocThresholds,
)

__all__ = [
    "FP32_TOPLOC",
    "PAPER_TOPLOC",
    "TOPLOC_PRESETS",
    "ValidatorSettings",
]


class ValidatorSettings(BaseModel):
    """How strict the validator is; docs/validator.md gives the measured honest spread of each figure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    toploc: ToplocThresholds = Field(
        default=FP32_TOPLOC,
        description="TOPLOC chunk thresholds (default: calibrated for fp32; PAPER_TOPLOC for bf16)",
    )
    logprob_tolerance: float = Field(
        default=1e-3,
        ge=0,
        description="largest |reported - recomputed| logprob (nats) of any token",
    )
    replay_tolerance: float = Field(
        default=1e-5,
        ge=0,
        description="slack on the CDF interval a token's seed uniform must fall in (numerical "
        "drift between the worker's decode and the validator's prefill)",
    )
    replay_floor: float = Field(
        default=1e-4,
        ge=0,
        le=1,
        description="a token less likely than this under the claimed policy gets only "
        "replay_floor_tolerance as slack",
    )
    replay_floor_tolerance: float = Field(
        default=1e-6,
        ge=0,
        description="slack for a token below replay_floor: a tiny interval can drift by more "
        "than its width, so zero would reject honest draws of it",
    )
    max_replay_misses: int = Field(
        default=0, ge=0, description="tokens per sample allowed outside their replayed CDF interval"
    )
    min_eos_prob: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="an EOS that ends a sample must have had at least this probability ...",
    )
    replay_exempts_eos: bool = Field(
        default=True,
        description="... unless the seed replay confirms the worker drew it (an honest draw)",
    )
    sampling_alpha: float = Field(
        default=1e-6, gt=0, lt=1, description="false-reject rate of each file-level sampling test"
    )
    value_tolerance: float = Field(
        default=1e-5,
        ge=0,
        description="largest |stored - recomputed| reward, penalty or (relative) advantage",
    )
    token_budget: int = Field(default=16384, ge=1, description="padded tokens per prefill batch")
