"""The trainer's step metrics: one typed record per trained step, in `metrics.jsonl`.

The trainer writes them, `swarmrl run` shows and sums them, `swarmrl trainer` prints
them; all three read the fields through `StepMetrics`. The trainer also reports the
dashboard's share of each record to the orchestrator (`dashboard_report`).
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarmrl.jsonl import read_jsonl
from swarmrl.protocol import models as api


class StepMetrics(BaseModel):
    """What one rollout step trained on and how the update went."""

    # NaN (no length targets) is written as the JSON constant, which json.loads reads back.
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    step: int = Field(description="rollout step n (it produced checkpoint n+1)")
    time: float = Field(description="unix time the step finished")
    reward: float = Field(description="mean reward of every sample read for the step")
    task_reward: float = Field(description="mean task reward (0/1 from the verifier)")
    length_penalty: float = Field(description="mean length penalty")
    length_error: float = Field(description="mean |target - length| (NaN without targets)")
    loss: float
    grad_norm: float = Field(description="mean gradient norm before clipping")
    grad_norm_max: float
    clip_ratio: float = Field(description="fraction of tokens whose ratio was clipped")
    entropy: float
    trained_tokens: int
    lr: float
    is_weight_mean: float = Field(
        1.0, description="mean off-policy weight over completion tokens (masked ones count 0)"
    )
    is_weight_max: float = Field(1.0, description="largest off-policy weight of the step")
    is_masked_share: float = Field(
        0.0, description="share of completion tokens the off-policy correction masked"
    )
    behaviour_kl: float = Field(
        0.0, description="k3 estimate of KL(sampling policy || policy n) per completion token"
    )
    update_kl: float = Field(
        0.0,
        description="mean KL(policy before || after) per completion token of the step's optimizer steps, after the trust region (0 when it is off)",
    )
    update_kl_full: float = Field(
        0.0,
        description="largest KL per token an optimizer step made before the trust region shrank it",
    )
    update_scale: float = Field(
        1.0,
        description="smallest fraction of an optimizer step the trust region kept (1: none shrunk)",
    )
    staleness_mean: float = Field(description="mean n - policy_step of the trained samples")
    staleness_max: int
    oldest_policy_step: int
    samples: int = Field(description="samples trained on")
    samples_read: int = Field(description="samples read, including the filtered ones")
    dropped_zero_advantage: int
    dropped_stale: int
    rejected_files: int
    recomputed_mismatch_files: int = Field(
        0, description="files whose claimed rewards or advantages the trainer's differ from"
    )
    wait_seconds: float = Field(description="time the trainer waited for usable samples")
    train_seconds: float
    step_seconds: float
    tokens_per_second: float

    def line(self) -> str:
        return self.model_dump_json() + "\n"


def read_metrics(path: Path) -> list[StepMetrics]:
    """Every complete step record of a metrics file; a line cut short by a kill (or
    otherwise not a step record) is skipped."""
    records = []
    for raw in read_jsonl(path):
        try:
            records.append(StepMetrics.model_validate(raw))
        except ValidationError:
            continue
    return records


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def dashboard_report(record: StepMetrics) -> api.MetricsReport:
    """What the dashboard draws of a step record; a measure that is not finite (NaN
    without length targets, a diverged update) is sent as None."""
    return api.MetricsReport(
        step=record.step,
        reward=_finite(record.reward),
        task_reward=_finite(record.task_reward),
        length_error=_finite(record.length_error),
        grad_norm=_finite(record.grad_norm),
        clip_ratio=_finite(record.clip_ratio),
        entropy=_finite(record.entropy),
        staleness_mean=record.staleness_mean,
        staleness_max=record.staleness_max,
        samples=record.samples,
        step_seconds=record.step_seconds,
    )
