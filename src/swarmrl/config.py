"""Typed run configuration: pydantic models, TOML loading and command-line overrides.

Every field carries its help text; `swarmrl run --help` prints them all. A value can
come from the defaults, a TOML file (`--config FILE`), or a flag named after its
dotted path (`--trainer.lr 1e-3`), later sources winning.
"""

from __future__ import annotations

import argparse
import json
import logging
import tomllib
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from swarmrl.runfolder import RunFolder
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


class TaskConfig(_Section):
    name: Literal["arithmetic", "math", "code"] = Field(
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

    @model_validator(mode="after")
    def _needs_path(self) -> TaskConfig:
        if self.name != "arithmetic" and not self.path:
            raise ValueError(f"task.path is required for the {self.name} task")
        if any(t <= 0 for t in self.target_lengths):
            raise ValueError("task.target_lengths must be positive")
        return self


class SamplingConfig(_Section):
    temperature: float = Field(
        0.6, gt=0, description="sampling temperature; the trainer divides logits by the same value"
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
    off_policy: Literal["none", "tis", "icepop", "seq_mask"] = Field(
        "tis",
        description="correction for samples drawn by an older policy than the trainer's (trainer/offpolicy.py): tis = token weight min(rho, tis_cap), icepop = weight rho inside icepop_band and 0 outside, seq_mask = mask a sequence whose geometric-mean rho leaves seq_mask_band, none = no correction; rho = pi_n / worker's sampling probability",
    )
    tis_cap: float = Field(
        2.0, ge=1, description="cap on the truncated importance weight (off_policy = tis)"
    )
    icepop_band: tuple[float, float] = Field(
        (0.5, 5.0), description="[low, high] band of rho kept by off_policy = icepop"
    )
    seq_mask_band: tuple[float, float] = Field(
        (0.5, 2.0),
        description="[low, high] band of a sequence's geometric-mean rho kept by off_policy = seq_mask",
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "cosine",
        description="learning rate after the warm-up: constant, or cosine decay to lr * lr_final_ratio at the last step",
    )
    lr_final_ratio: float = Field(
        0.1, ge=0, le=1, description="learning rate at the last step over lr (lr_schedule = cosine)"
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
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="fp32, or bf16 compute with fp32 master weights, gradient reductions and optimizer state (for GPUs; needs the sharded trainer, i.e. torchrun)",
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
        0.5, gt=0, description="how often the validator looks for new rollout files"
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
    model: ModelConfig = Field(default_factory=ModelConfig, description="starting model")
    task: TaskConfig = Field(default_factory=TaskConfig, description="task and reward")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="sampling")
    worker: WorkerConfig = Field(default_factory=WorkerConfig, description="inference workers")
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


class ConfigError(ValueError):
    """A configuration value is invalid; the message is one line naming the field."""


def _flat_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_flat_fields(annotation, f"{prefix}{name}."))
        else:
            out.append((f"{prefix}{name}", field))
    return out


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE` and one `--<dotted.field>` flag per field, with its help text."""
    parser.add_argument("--config", type=Path, help="TOML file with any of the fields below")
    for dotted, field in _flat_fields(RunConfig):
        default = field.default if field.default_factory is None else field.default_factory()
        parser.add_argument(
            f"--{dotted}",
            dest=f"cfg__{dotted}",
            metavar="VALUE",
            default=None,
            help=f"{field.description} [default: {json.dumps(default)}]",
        )
    # Old names still accepted (the model maps them and warns), no longer advertised.
    parser.add_argument(
        "--task.length_penalty",
        dest="cfg__task.length_penalty",
        default=None,
        help=argparse.SUPPRESS,
    )


def _is_text(annotation: Any) -> bool:
    """A field typed `str` or `str | None`: its flag value is taken as written."""
    return annotation is str or (
        get_origin(annotation) in (Union, UnionType) and str in get_args(annotation)
    )


_TEXT_FIELDS = {dotted for dotted, field in _flat_fields(RunConfig) if _is_text(field.annotation)}


def _parse_flag(dotted: str, value: str) -> Any:
    # Flags arrive as text; JSON gives numbers, booleans, lists and null their types, and
    # anything that is not JSON is taken as a plain string. A text field keeps the text as
    # written, so `--run_name 2024` names a run "2024" rather than failing as a number.
    if dotted in _TEXT_FIELDS:
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    got = (
        f" (got {json.dumps(first['input'], default=str)})"
        if "input" in first and not isinstance(first["input"], dict)
        else ""
    )
    return f"invalid config: {where}: {first['msg']}{got}"


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults < TOML file < overrides (dotted keys). Raises ConfigError with one line."""
    tree: dict = {}
    if path is not None:
        try:
            tree = (
                tomllib.loads(Path(path).read_text())
                if Path(path).suffix == ".toml"
                else json.loads(Path(path).read_text())
            )
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except IsADirectoryError:
            raise ConfigError(
                f"--config {path} is a directory; give a TOML (or JSON) file, e.g. examples/arithmetic.toml"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc}") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid: {exc}") from None
    for dotted, value in (overrides or {}).items():
        _set_dotted(tree, dotted, value)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


def config_from_args(args: argparse.Namespace) -> RunConfig:
    overrides = {
        key.removeprefix("cfg__"): _parse_flag(key.removeprefix("cfg__"), value)
        for key, value in vars(args).items()
        if key.startswith("cfg__") and value is not None
    }
    return load_config(args.config, overrides)


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
