"""The run config's sections, one per role or mechanism: each field with its help text
(`swarmrl run --help` prints them)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarmrl.rewards import DEFAULT_SHAPING, AdvantageMode, LengthShaping
from swarmrl.toploc.thresholds import TOPLOC_PRESETS

logger = logging.getLogger(__name__)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    path: str | None = Field(
        None,
        description="Hugging Face causal LM directory to start from; empty = the embedded tiny model (built and cached on first use)",
    )
    cache_dir: str | None = Field(
        None,
        description="where the embedded model is cached (default: $SWARMRL_CACHE or ~/.cache/swarmrl)",
    )


TaskName = Literal["arithmetic", "math", "code"]


class TaskConfig(_Section):
    name: TaskName = Field(
        "arithmetic",
        description="task: arithmetic (embedded), math (\\boxed{} answers, math-verify) or code (tests in a sandbox)",
    )
    path: str | None = Field(
        None,
        description="JSONL or Parquet file of problems (required for math and code; arithmetic: optional rows of a, b, e.g. from `swarmrl filter`)",
    )
    eval_path: str | None = Field(
        None,
        description="separate held-out file (math and code); default: a held-out tail of `path`",
    )
    eval_size: int = Field(
        256,
        ge=1,
        description="held-out problems to evaluate on (math and code: the last eval_size problems of `path`; ignored when eval_path is given)",
    )
    target_lengths: list[int] = Field(
        [32, 41],
        description="target completion lengths (tokens), one sampled per prompt and written into it; empty = no length target",
    )
    length_alpha: float = Field(
        0.2,
        ge=0,
        description="alpha in reward = task reward - alpha*|target - length| (paper: 3e-4 for thousands of tokens)",
    )
    length_alpha_start: float | None = Field(
        None,
        ge=0,
        description="length curriculum: alpha at step 0, moving linearly to length_alpha over "
        "length_alpha_steps steps (the style settled before the sums are learned); empty = none",
    )
    length_alpha_steps: int = Field(
        0, ge=0, description="steps over which alpha moves from length_alpha_start to length_alpha"
    )
    length_shaping: LengthShaping = Field(
        DEFAULT_SHAPING,
        description="scale (default): reward = task reward * exp(-alpha*|target - length|), so "
        "the length only ranks samples of equal task reward; subtract: reward = task reward - "
        "alpha*|target - length| (the paper's)",
    )
    advantage_mode: AdvantageMode = Field(
        "joint",
        description="joint: a group's advantages normalize its total rewards (GRPO's); "
        "decoupled: the task reward and the length penalty are each normalized within the "
        "group, added and normalized again, so a spread in length never drowns one in correctness; "
        "centered: the total reward minus the group mean, not divided by the std (Dr. GRPO)",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        # task.length_penalty was the old name of length_alpha; configs that use it keep working.
        if not isinstance(data, dict) or "length_penalty" not in data:
            return data
        data = dict(data)
        old = data.pop("length_penalty")
        if "length_alpha" in data:
            raise ValueError(
                "task.length_penalty is the old name of task.length_alpha; give only length_alpha"
            )
        logger.warning(
            "task.length_penalty is deprecated: rename it task.length_alpha (the same coefficient)"
        )
        data["length_alpha"] = old
        return data

    def alpha_at(self, step: int) -> float:
        """The length coefficient for samples of `step`: length_alpha, or on the curriculum."""
        if self.length_alpha_start is None or step >= self.length_alpha_steps:
            return self.length_alpha
        share = max(step, 0) / self.length_alpha_steps
        return self.length_alpha_start + share * (self.length_alpha - self.length_alpha_start)

    @model_validator(mode="after")
    def _needs_path(self) -> TaskConfig:
        if self.name != "arithmetic" and not self.path:
            raise ValueError(f"task.path is required for the {self.name} task")
        if any(t <= 0 for t in self.target_lengths):
            raise ValueError("task.target_lengths must be positive")
        return self


# Prompt plus completion tokens assumed of the model (the run does not state its context):
# a sample's prompt may hold this less sampling.max_new_tokens (rollouts.RolloutBounds).
CONTEXT_TOKENS = 4096


class SamplingConfig(_Section):
    temperature: float = Field(
        1.0,
        gt=0,
        description="sampling temperature; the trainer divides logits by the same value (the paper: 0.6 for a 32B model; the embedded model is so sure of itself at 0.6 that a group's samples mostly agree and asynchronous runs collapsed: docs/trainer.md)",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling threshold (1 = off)")
    max_new_tokens: int = Field(48, ge=1, description="completion length limit")
    group_size: int = Field(
        8, ge=2, description="G: samples per prompt; advantages are normalized within a group"
    )


class WorkerConfig(_Section):
    count: int = Field(2, ge=1, description="inference worker processes started by `swarmrl run`")
    prompts_per_file: int = Field(
        8, ge=1, description="prompts per work submission (one rollout file)"
    )
    threads: int = Field(1, ge=1, description="torch threads per worker process")
    poll_seconds: float = Field(
        0.2, gt=0, description="how often an idle worker looks for a new checkpoint or step"
    )
    policy_lag: int = Field(
        0,
        ge=0,
        description="for measuring learning under staleness: generate with the oldest loaded checkpoint at most this many steps older than the newest one the worker loaded (0 = always the newest; an honest worker, the file names the policy it used)",
    )


class InferenceConfig(_Section):
    engine: Literal["native", "vllm"] = Field(
        "native",
        description="what generates a worker's samples: `native` (swarmrl's own sampling loop) or `vllm` (a vLLM engine drawing with swarmrl's seeded draw, so the validator's replay stays exact; needs `pip install -e \".[vllm]\"`, docs/architecture.md)",
    )
    vllm_eager: bool = Field(
        True,
        description="vllm engine: run the model eagerly (no torch.compile warm-up: minutes on a CPU, worth it only for long runs of a big model)",
    )
    vllm_kv_cache_gib: int = Field(
        1, ge=1, description="vllm engine on a CPU: GiB of memory its key/value cache takes"
    )


class ShardcastConfig(_Section):
    enabled: bool = Field(
        True,
        description="the trainer publishes checkpoints through a SHARDCAST origin; workers and the validator fetch them only that way, so a pool needs it on",
    )
    relays: int = Field(
        1,
        ge=1,
        description="relays `swarmrl run` starts (chained: relay i mirrors relay i-1, the first mirrors the origin)",
    )
    shard_size: int = Field(
        2_000_000, ge=1024, description="bytes per shard (reference default 50,000,000)"
    )
    keep: int = Field(4, ge=1, description="versions the origin keeps listed")
    poll_seconds: float = Field(
        0.2, gt=0, description="how often a relay checks its upstream for new versions"
    )
    deltas: bool = Field(
        True,
        description="workers holding the previous checkpoint fetch the next one as a delta against it (rebuilt, checked by its BLAKE3, the full shards on any trouble); off: the trainer's origin publishes none and workers fetch full shards",
    )
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="precision of the broadcast checkpoints: fp32, the trainer's weights exactly; bf16, each weight rounded to bf16 (workers and the validator compute in fp32 from the rounded values, the off-policy correction covers the difference): half the bytes, and deltas much smaller still (docs/shardcast.md)",
    )
    workers_fetch_origin: bool = Field(
        False,
        description="workers fetch checkpoints from the trainer's origin as well as from the relays (each shard from a server drawn by measured bandwidth): a new checkpoint reaches them before a relay has mirrored it, and the relays' links are shared less, at the cost of the origin's egress; off: only from the relays (the origin when none is registered)",
    )


# The trainer's corrections for samples of an older policy (trainer/offpolicy.py).
OffPolicyMode = Literal["none", "tis", "icepop", "seq_mask"]
# The policy the loss's ratio is taken against (trainer/update.py).
ProximalMode = Literal["step", "minibatch"]


class TrainerConfig(_Section):
    steps: int = Field(50, ge=0, description="rollout steps to train (checkpoints 1..steps)")
    batch_samples: int = Field(
        128, ge=1, description="non-zero-advantage samples consumed per rollout step (whole groups)"
    )
    max_read_ratio: float = Field(
        4.0,
        ge=0,
        description="a step that has read this many times batch_samples and still lacks a full batch of samples with signal trains on the usable ones it has (at least one group): once the task is nearly solved, groups whose rewards all agree make most of what is read, and a full batch would take ever more generation; 0 = always wait for a full batch",
    )
    optimizer_steps: int = Field(
        2,
        ge=1,
        description="optimizer steps per rollout step (the batch is split into this many minibatches)",
    )
    lr: float = Field(
        1e-4,
        gt=0,
        description="AdamW learning rate (paper: 3e-7 for 32B; tiny models tolerate more, but Adam moves every weight by about lr per step, so keep it small)",
    )
    warmup_steps: int = Field(
        2, ge=0, description="linear learning-rate warm-up, in optimizer steps"
    )
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip (paper: 0.05-0.1 for 32B)")
    epsilon: float = Field(
        0.2, gt=0, lt=1, description="two-sided ratio clip: ratio is clipped to [1-eps, 1+eps]"
    )
    delta: float = Field(
        4.0, gt=1, description="cap on the ratio for negative advantages (paper: 4)"
    )
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus coefficient (0 = off)")
    off_policy: OffPolicyMode = Field(
        "tis",
        description="correction for samples drawn by an older policy than the trainer's (trainer/offpolicy.py): tis = token weight min(rho, tis_cap), icepop = weight rho inside icepop_band and 0 outside, seq_mask = mask a sequence whose geometric-mean rho leaves seq_mask_band, none = no correction; rho = pi_n / worker's sampling probability",
    )
    tis_cap: float = Field(
        2.0,
        ge=1,
        description="cap on the truncated importance weight (off_policy = tis); 1 weighs no token up, which measured fewer dips in the default runs but slower, deeper-dipping runs at staleness 2 (docs/trainer.md)",
    )
    behaviour_clip: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="PPO's clip against the policy that sampled each token, on top of off_policy: a token whose probability has already moved past 1 +- behaviour_clip (the ratio rho = pi_n / worker's sampling probability) in its advantage's direction gets no gradient this step, so an asynchronous step does not push again what the steps since the sampling already moved (measured in docs/trainer.md); 0 = off",
    )
    icepop_band: tuple[float, float] = Field(
        (0.5, 5.0), description="[low, high] band of rho kept by off_policy = icepop"
    )
    seq_mask_band: tuple[float, float] = Field(
        (0.5, 2.0),
        description="[low, high] band of a sequence's geometric-mean rho kept by off_policy = seq_mask",
    )
    proximal: ProximalMode = Field(
        "minibatch",
        description="the policy the loss's ratio and clip are taken against: minibatch = the live policy at each minibatch (no extra forward pass; the ratio is 1, so the clip acts only through behaviour_clip), step = the policy at the rollout step's start (the paper's; every minibatch after the first needs one more forward pass to recompute it); measured in docs/trainer.md",
    )
    max_update_kl: float = Field(
        0.0,
        ge=0,
        description="trust region: an optimizer step whose KL(policy before || after) per completion token, measured on its minibatch by one more forward pass, exceeds this is pulled back along its direction until it does not (trainer/trust_region.py); 0 = off",
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "cosine",
        description="learning rate after the warm-up: constant, or cosine decay to lr * lr_final_ratio at the last step",
    )
    lr_final_ratio: float = Field(
        0.5,
        ge=0,
        le=1,
        description="learning rate at the last step over lr (lr_schedule = cosine); 0.5 leaves the late steps enough to learn the length (docs/trainer.md)",
    )

    @field_validator("icepop_band", "seq_mask_band")
    @classmethod
    def _band(cls, band: tuple[float, float]) -> tuple[float, float]:
        low, high = band
        if not 0 <= low < 1 < high:
            raise ValueError(f"a band [low, high] needs 0 <= low < 1 < high (got {list(band)})")
        return band

    keep_checkpoints: int = Field(
        4, ge=1, description="checkpoints kept on disk (at least async_level + 1 are always kept)"
    )
    threads: int = Field(1, ge=1, description="torch threads for the trainer process (per rank)")
    seed: int = Field(0, description="trainer seed")
    ranks: int = Field(
        1,
        ge=1,
        description="trainer processes on this machine: above 1, `swarmrl trainer` starts itself under `torchrun --standalone --nproc-per-node ranks` and shards the model with FSDP2 (ignored when already started by torchrun, which sets the world size)",
    )
    micro_batch_samples: int | None = Field(
        None,
        ge=1,
        description="samples per forward/backward pass on a rank, gradients accumulated across them (bounds activation memory; the update does not change); empty = the rank's whole share of a minibatch",
    )
    activation_checkpointing: bool = Field(
        False,
        description="recompute each decoder layer's activations in the backward pass instead of keeping them (less memory, about one more forward of time)",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "fp32",
        description="auto: bf16 where the trainer's device multiplies bf16 natively (a GPU with bf16; a CPU with AVX512-BF16 or AMX), fp32 elsewhere; fp32; or bf16 compute with fp32 master weights, gradient reductions and optimizer state: sharded (torchrun), parameters cast to bf16 by FSDP2; one process, the forward passes under bf16 autocast (matrix products in bf16, logprobs in fp32)",
    )


class ValidatorConfig(_Section):
    fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        description="fraction of uploaded rollout files the orchestrator hands to the validator, chosen by HMAC(secret, file hash) so a worker cannot tell which (0 = no validator process)",
    )
    toploc: str = Field(
        "fp32",
        description="TOPLOC thresholds, a preset of swarmrl.toploc.TOPLOC_PRESETS: fp32 (calibrated on fp32 models) or paper (bf16 GPUs)",
    )

    @field_validator("toploc")
    @classmethod
    def _known_preset(cls, name: str) -> str:
        if name not in TOPLOC_PRESETS:
            raise ValueError(f"unknown TOPLOC preset {name!r}; one of {sorted(TOPLOC_PRESETS)}")
        return name

    threads: int = Field(1, ge=1, description="torch threads for the validator process")
    poll_seconds: float = Field(
        0.5,
        gt=0,
        description="pause before looking for new rollout files again after an empty answer that came back before wait_seconds (an orchestrator that holds no request)",
    )
    wait_seconds: float = Field(
        2.0,
        ge=0,
        le=10,
        description="with nothing to judge, the orchestrator holds the validator's request up to this long for an upload (a long poll: a verdict starts as soon as a file comes in, and a file chosen for validation reaches the trainer only after its verdict); 0: look every poll_seconds",
    )


class PoolConfig(_Section):
    port: int = Field(
        0,
        ge=0,
        le=65535,
        description="loopback port of the orchestrator `swarmrl run` starts (0 = a free port, chosen once per run so a restarted orchestrator keeps its URL)",
    )
    surplus: float = Field(
        0.1,
        ge=0,
        le=1,
        description="extra share of a step's need the orchestrator issues to cover lapses and rejects",
    )
    heartbeat_seconds: float = Field(
        2.0,
        gt=0,
        description="interval members heartbeat at (a worker learns of a new checkpoint or the run's end from its heartbeat)",
    )
    dead_seconds: float = Field(
        60.0,
        gt=0,
        description="silence after which a member is declared dead (its open assignments are reissued); half of it makes it unhealthy. Generous: on a loaded machine a busy process's heartbeats come late",
    )
    assignment_seconds: float = Field(
        120.0,
        gt=0,
        description="deadline of an assignment; a worker that misses it loses it and it is reissued (a worker killed mid-assignment holds it until then, so its step waits up to this long)",
    )
    stake: float = Field(
        10.0,
        ge=0,
        description="stake each worker locks to register; the run's owner key (<run>/keys/owner.key) funds the workers at start. 0: a closed pool, no stake and no funding",
    )


class SupervisionConfig(_Section):
    max_restarts: int = Field(
        3,
        ge=0,
        description="`swarmrl run` aborts when one process has been restarted this many times within window_seconds and fails again",
    )
    window_seconds: float = Field(
        300.0, gt=0, description="the window that max_restarts counts restarts in"
    )
    backoff_seconds: float = Field(
        1.0,
        ge=0,
        description="delay before restarting a failed process; doubles with each further failure in the window",
    )
    backoff_max_seconds: float = Field(
        30.0,
        ge=0,
        description="cap on the restart delay (and on a worker's policy-load retry delay)",
    )
    stop_grace_seconds: float = Field(
        5.0,
        gt=0,
        description="on shutdown, seconds a process gets to exit after SIGTERM before it is killed",
    )


class LogConfig(_Section):
    backend: Literal["off", "tensorboard", "mlflow"] = Field(
        "off",
        description="where the trainer also logs its step metrics: off; tensorboard (event files, written without the tensorboard package; view with `tensorboard --logdir DIR`); or mlflow (metrics, the config as parameters and the run's summary; needs `pip install -e '.[mlflow]'`)",
    )
    dir: str | None = Field(
        None,
        description="folder of the event files or of the MLflow SQLite store (default: <run>/tensorboard, <run>/mlflow)",
    )
    uri: str | None = Field(
        None,
        description="mlflow: the tracking URI (a server's http://host:port, or any store URI); default: a SQLite store in log.dir",
    )
    experiment: str = Field(
        "swarmrl", min_length=1, description="mlflow: the experiment the run is logged under"
    )
