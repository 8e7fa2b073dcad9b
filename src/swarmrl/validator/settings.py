"""How strict the validator is: every threshold, and the named TOPLOC presets.

docs/validator.md gives the measured honest worst of each figure and the margin each
threshold keeps over it. ``TOPLOC_PRESETS`` is the one list of presets; the run config
(``validator.toploc``) and `swarmrl validate --toploc` take their names from it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from swarmrl.toploc.thresholds import PAPER_THRESHOLDS, ToplocThresholds

# TOPLOC thresholds calibrated for fp32 workers and validators (docs/validator.md). The
# paper's 38/10/8 were set for bf16 on GPUs; on fp32 they pass weights perturbed by 10%
# of their spread. Use the paper preset when workers run bf16.
FP32_TOPLOC = ToplocThresholds(max_exp_mismatches=8, max_mant_err_mean=0.5, max_mant_err_median=1.0)
PAPER_TOPLOC = PAPER_THRESHOLDS
TOPLOC_PRESETS: dict[str, ToplocThresholds] = {"fp32": FP32_TOPLOC, "paper": PAPER_TOPLOC}


def toploc_preset_help() -> str:
    return ", ".join(
        f"{name} ({t.max_exp_mismatches}/{t.max_mant_err_mean:g}/{t.max_mant_err_median:g})"
        for name, t in TOPLOC_PRESETS.items()
    )


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
