"""The run's config, composed of its sections, and what a resumed run must share with the
run it continues."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from swarmrl.config.sections import (
    InferenceConfig,
    LogConfig,
    ModelConfig,
    PoolConfig,
    SamplingConfig,
    ShardcastConfig,
    SupervisionConfig,
    TaskConfig,
    TrainerConfig,
    ValidatorConfig,
    WorkerConfig,
    _Section,
)
from swarmrl.runfolder import RunFolder


class RunConfig(_Section):
    run_name: str = Field(
        "default",
        description="name of the run; outputs go to <output_dir>/<run_name> (any valid folder name)",
    )
    output_dir: str = Field("outputs", description="parent folder of run folders")
    async_level: int = Field(
        2,
        ge=0,
        description="k: samples for step n must come from a policy >= n-k (0 = synchronous)",
    )
    seed: int = Field(0, description="seed for prompt assignment and sampling")
    eval_before: bool = Field(
        True, description="evaluate the starting checkpoint on the held-out split"
    )
    eval_after: bool = Field(
        True, description="evaluate the final checkpoint on the held-out split"
    )
    eval_temperature: float = Field(
        0.6,
        gt=0,
        description="sampling temperature of the held-out evaluation (pass@1), apart from the training's sampling.temperature so that the yardstick stays put when the recipe changes (0.6: the paper's)",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="starting model")
    task: TaskConfig = Field(default_factory=TaskConfig, description="task and reward")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="sampling")
    worker: WorkerConfig = Field(default_factory=WorkerConfig, description="inference workers")
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig, description="the engine inference workers generate with"
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="GRPO trainer")
    shardcast: ShardcastConfig = Field(
        default_factory=ShardcastConfig, description="checkpoint broadcast"
    )
    validator: ValidatorConfig = Field(
        default_factory=ValidatorConfig, description="the validator process"
    )
    pool: PoolConfig = Field(
        default_factory=PoolConfig, description="the orchestrator `swarmrl run` starts"
    )
    supervision: SupervisionConfig = Field(
        default_factory=SupervisionConfig,
        description="how `swarmrl run` restarts failed processes and stops them",
    )
    log: LogConfig = Field(
        default_factory=LogConfig, description="the trainer's metrics in other tools' formats"
    )

    @field_validator("run_name")
    @classmethod
    def _folder_name(cls, name: str) -> str:
        # One path component that the file system accepts: the run folder is output_dir/run_name.
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError("must be a folder name (not empty, '.' or '..', no '/')")
        if len(name.encode()) > 255:
            raise ValueError("must be at most 255 bytes (a folder name)")
        return name

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    @property
    def folder(self) -> RunFolder:
        """The run folder's named paths (runfolder.py)."""
        return RunFolder(self.run_dir)


# What a run folder's checkpoints depend on: the start model, the task and the recipe.
# Anything else (steps, threads, worker count, polling, evaluation, supervision) may
# change between the runs that share a folder.
RUN_IDENTITY = (
    "model.path",
    "task",
    "sampling",
    "async_level",
    "seed",
    "trainer.batch_samples",
    "trainer.optimizer_steps",
    "trainer.lr",
    "trainer.warmup_steps",
    "trainer.betas",
    "trainer.weight_decay",
    "trainer.grad_clip",
    "trainer.epsilon",
    "trainer.delta",
    "trainer.entropy_coef",
    "trainer.off_policy",
    "trainer.tis_cap",
    "trainer.behaviour_clip",
    "trainer.proximal",
    "trainer.icepop_band",
    "trainer.seq_mask_band",
    "trainer.lr_schedule",
    "trainer.lr_final_ratio",
    "trainer.seed",
)


def _leaves(tree: Any, prefix: str) -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_leaves(value, f"{prefix}.{key}"))
        return out
    return {prefix: tree}


def _identity(cfg: RunConfig) -> dict[str, Any]:
    tree = cfg.model_dump(mode="json")
    out: dict[str, Any] = {}
    for dotted in RUN_IDENTITY:
        value: Any = tree
        for part in dotted.split("."):
            value = value[part]
        out.update(_leaves(value, dotted))
    if out["model.path"] is not None:  # the same directory however it was spelled
        out["model.path"] = str(Path(out["model.path"]).expanduser().resolve())
    return out


def run_differences(saved: RunConfig, new: RunConfig) -> list[str]:
    """What differs between a run folder's config and a new one in what the run's
    checkpoints depend on, as `field: old -> new` (empty: the new run may resume it)."""
    old, now = _identity(saved), _identity(new)
    return [
        f"{key}: {json.dumps(old[key])} -> {json.dumps(now[key])}"
        for key in now
        if old.get(key) != now[key]
    ]
