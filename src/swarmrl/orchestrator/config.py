"""The orchestrator's settings: typed, each with its help text (the CLI flags follow them),
derived from the run's config once.

`swarmrl run` derives them with `orchestrator_settings(cfg, ...)`, writes them to
`<run>/orchestrator/config.toml` and starts the orchestrator with `--config` on that
file; a pool started by hand writes the same file from the members' run config
(`swarmrl orchestrator --run-config RUN.toml --write-config FILE`). A setting that the
run's config also holds (the recipe, the timings, the bounds on a file) takes its
default from the run config's default, so a bare orchestrator and a default run agree;
but for the run id and the last step, which it leaves unchecked, and the stake, which
needs an owner to fund it (docs/deployment.md, "One set of defaults").
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmrl.config import CONTEXT_TOKENS, ConfigError, RunConfig, read_config_file
from swarmrl.config.sections import TaskName
from swarmrl.protocol.models import TARGET_LENGTHS
from swarmrl.protocol.recipe import scoring_settings
from swarmrl.rewards import AdvantageMode, LengthShaping


def heartbeats(seconds: float, heartbeat_seconds: float) -> int:
    """Whole heartbeat intervals in `seconds`, rounded up (at least one): a member is
    declared unhealthy or dead no sooner than the run's config says."""
    return max(1, math.ceil(seconds / heartbeat_seconds))


_RUN = RunConfig()  # the run config's defaults, which the shared settings take as theirs
_RUN_SCORING = scoring_settings(_RUN)  # ... and how it samples and scores, by recipe name


class OrchestratorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ledger: str = Field(
        "sqlite:///orchestrator/ledger.db",
        description="ledger database URL: sqlite:///FILE or postgresql://USER@HOST/DB",
    )
    store: str = Field(
        "orchestrator/rollouts",
        description="fsspec URL of the rollout store (a local folder, or s3://, gs://, ...)",
    )
    secret_file: str = Field(
        "orchestrator/secret",
        description="file with the orchestrator's secret (hex); created with mode 0600 if missing; "
        "assignment seeds and the validation choice derive from it, so keep it across restarts",
    )
    allowlist: str | None = Field(
        None,
        description="file of 'ADDRESS ROLE' lines: who may register as trainer, validator or relay "
        "(and as worker when open_workers is off)",
    )
    open_workers: bool = Field(
        True,
        description="any signed key may register as a worker (off: workers need the allowlist)",
    )
    run_id: str | None = Field(
        None,
        description="run id every uploaded file must carry in its metadata (unset: not checked)",
    )
    steps: int | None = Field(
        None,
        ge=1,
        description="rollout steps of the run; no assignment is issued for step >= steps",
    )
    batch_samples: int = Field(
        _RUN.trainer.batch_samples,
        ge=1,
        description="usable (non-zero-advantage) samples a step needs (the run's trainer.batch_samples)",
    )
    prompts_per_assignment: int = Field(
        _RUN.worker.prompts_per_file,
        ge=1,
        description="prompts in one assignment (the run's worker.prompts_per_file)",
    )
    group_size: int = Field(
        _RUN.sampling.group_size,
        ge=2,
        description="samples per prompt (the run's sampling.group_size)",
    )
    async_level: int = Field(
        _RUN.async_level, ge=0, description="k: a step-n assignment needs a policy >= n-k"
    )
    max_ahead: int = Field(
        1,
        ge=0,
        description="issue work for at most this many steps past the newest checkpoint "
        "(within the async bound): lower staleness, at the cost of idle workers",
    )
    surplus: float = Field(
        _RUN.pool.surplus,
        ge=0,
        le=1,
        description="extra share of a step's need issued to cover lapses and rejects",
    )
    max_read_ratio: float = Field(
        _RUN.trainer.max_read_ratio,
        ge=0,
        description="the run's trainer.max_read_ratio: a step's work stops at this many times "
        "batch_samples samples (those the trainer read, those in trainable files it has not "
        "read, those its open assignments will bring), since the trainer reads no more for "
        "it; past that one assignment at a time, and only once the trainer has read all there "
        "is and nothing is open while the step is not full (0 = no cap)",
    )
    prior_yield: float = Field(
        0.5,
        gt=0,
        le=1,
        description="share of usable samples assumed before any file arrived (then the observed one)",
    )
    max_open_per_worker: int = Field(
        2, ge=1, description="open assignments one worker may hold at a time"
    )
    speculate: bool = Field(
        True,
        description="when a step waits only on open work and a worker is idle, issue it the share "
        "of an open assignment whose holder missed a heartbeat or is straggler_factor times slower "
        "than the pool's usual; the first good upload counts, the other file is voided without "
        "penalty (off: a silent worker stalls its step until its assignment lapses)",
    )
    straggler_factor: float = Field(
        4.0,
        gt=1,
        description="an open assignment held this many times longer than the median of the "
        "newest returned ones is re-issued to an idle worker (with speculate)",
    )
    assignment_seconds: float = Field(
        _RUN.pool.assignment_seconds,
        gt=0,
        description="deadline of an assignment; then it lapses (counted against the worker)",
    )
    heartbeat_seconds: float = Field(
        _RUN.pool.heartbeat_seconds, gt=0, description="interval members heartbeat at"
    )
    unhealthy_after: int = Field(
        heartbeats(_RUN.pool.dead_seconds / 2, _RUN.pool.heartbeat_seconds),
        ge=1,
        description="missed heartbeats before a member is unhealthy (from the run: half of "
        "pool.dead_seconds)",
    )
    dead_after: int = Field(
        heartbeats(_RUN.pool.dead_seconds, _RUN.pool.heartbeat_seconds),
        ge=1,
        description="missed heartbeats before a member is dead, its assignments reissued (from "
        "the run: pool.dead_seconds)",
    )
    timestamp_window: float = Field(
        60.0, gt=0, description="seconds a signed request's timestamp may differ from the clock"
    )
    rate_per_second: float = Field(20.0, gt=0, description="requests per second per address")
    rate_burst: int = Field(60, ge=1, description="requests an address may send in one burst")
    join_rate_per_second: float = Field(
        50.0,
        gt=0,
        description="new members the pool registers per second, whoever asks (each is a "
        "ledger row; a free pool is open to any number of new keys); over it, 429 and the "
        "member retries",
    )
    join_burst: int = Field(1000, ge=1, description="new members registered in one burst")
    max_upload_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="largest rollout file accepted"
    )
    max_new_tokens: int = Field(
        _RUN.sampling.max_new_tokens,
        ge=1,
        le=1 << 20,
        description="completion tokens a sample may hold (the run's sampling.max_new_tokens): "
        "with the assignment's rows, bounds what an upload may decode to",
    )
    # How samples are drawn and scored (the rest of the recipe): the validator replays the
    # one and recomputes the other, so a member that differs writes files it rejects.
    temperature: float = Field(
        _RUN_SCORING["temperature"],
        gt=0,
        description="sampling temperature (the run's sampling.temperature)",
    )
    top_p: float = Field(
        _RUN_SCORING["top_p"],
        gt=0,
        le=1,
        description="nucleus sampling threshold (the run's sampling.top_p)",
    )
    task: TaskName = Field(
        _RUN_SCORING["task"], description="the task's name (the run's task.name)"
    )
    target_lengths: str = Field(
        _RUN_SCORING["target_lengths"],
        pattern=TARGET_LENGTHS,
        description="target completion lengths, comma-separated; empty: none (the run's "
        "task.target_lengths)",
    )
    length_alpha: float = Field(
        _RUN_SCORING["length_alpha"],
        ge=0,
        description="the length coefficient (the run's task.length_alpha)",
    )
    length_alpha_start: float = Field(
        _RUN_SCORING["length_alpha_start"],
        ge=0,
        description="the length coefficient at step 0 (the run's task.length_alpha_start; "
        "length_alpha when it has no curriculum)",
    )
    length_alpha_steps: int = Field(
        _RUN_SCORING["length_alpha_steps"],
        ge=0,
        description="steps of the length curriculum (the run's task.length_alpha_steps; 0: none)",
    )
    length_shaping: LengthShaping = Field(
        _RUN_SCORING["length_shaping"],
        description="how the length enters the reward (the run's task.length_shaping)",
    )
    advantage_mode: AdvantageMode = Field(
        _RUN_SCORING["advantage_mode"],
        description="how a group's advantages are formed (the run's task.advantage_mode)",
    )
    max_prompt_tokens: int = Field(
        CONTEXT_TOKENS - _RUN.sampling.max_new_tokens,
        ge=1,
        le=1 << 20,
        description="prompt tokens a sample may hold (the model's context less max_new_tokens)",
    )
    validation_fraction: float = Field(
        _RUN.validator.fraction,
        ge=0,
        le=1,
        description="share of files handed to validators, chosen by HMAC(secret, file hash)",
    )
    validation_lease_seconds: float = Field(
        600.0, gt=0, description="a file handed to a validator is handed out again after this"
    )
    new_member_files: int = Field(
        2,
        ge=0,
        description="a worker's first this many files are validated at new_member_validation_fraction",
    )
    new_member_validation_fraction: float = Field(
        1.0,
        ge=0,
        le=1,
        description="validation rate of a new member's files, and of the files after a soft "
        "invalidation (when above validation_fraction; never when validation_fraction is 0)",
    )
    soft_invalidation_files: int = Field(
        2,
        ge=0,
        description="files of a worker validated at new_member_validation_fraction after a soft "
        "invalidation of its work (late, stale, unverifiable)",
    )
    owner: str | None = Field(
        None,
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="the pool owner's address: the only key that may fund addresses "
        "(`swarmrl pool fund`); unset: nobody can",
    )
    min_stake: float = Field(
        0.0,
        ge=0,
        le=1e9,
        description="stake a worker locks from its balance to register (the run's pool.stake; "
        "0: no stake, a closed or free pool; above 0 it needs an owner to fund the workers)",
    )
    slash_fraction: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of a worker's stake taken when a validator rejects its file "
        "(the rest returns to its balance as it is ejected)",
    )
    pay_per_sample: float = Field(
        1.0, ge=0, le=1000, description="paid per sample of credited work, when its step ends"
    )
    pay_per_token: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="paid per generated token of credited work, when its step ends",
    )
    sweep_seconds: float = Field(
        1.0, gt=0, description="how often health, deadlines and old nonces are checked"
    )

    @field_validator("owner")
    @classmethod
    def _checksummed(cls, owner: str | None) -> str | None:
        from eth_utils import to_checksum_address

        return None if owner is None else to_checksum_address(owner)

    @model_validator(mode="after")
    def _stake_needs_an_owner(self) -> OrchestratorConfig:
        if self.min_stake > 0 and self.owner is None:
            raise ValueError(
                f"min_stake {self.min_stake:g} needs an owner to fund the workers' stake: give "
                "the owner's address (--owner, the key of `swarmrl pool fund`), or 0 for a "
                "closed pool (a run config's pool.stake)"
            )
        return self


def run_settings(cfg: RunConfig) -> dict[str, Any]:
    """The orchestrator's settings that the run's config holds: its recipe, timings,
    validation rate, stake and the bounds on a file, under the orchestrator's names."""
    pool = cfg.pool
    return {
        "run_id": cfg.run_name,
        "steps": cfg.trainer.steps or None,  # the run's 0: no last step
        "batch_samples": cfg.trainer.batch_samples,
        "prompts_per_assignment": cfg.worker.prompts_per_file,
        "group_size": cfg.sampling.group_size,
        "async_level": cfg.async_level,
        "surplus": pool.surplus,
        "max_read_ratio": cfg.trainer.max_read_ratio,
        "validation_fraction": cfg.validator.fraction,
        "heartbeat_seconds": pool.heartbeat_seconds,
        "unhealthy_after": heartbeats(pool.dead_seconds / 2, pool.heartbeat_seconds),
        "dead_after": heartbeats(pool.dead_seconds, pool.heartbeat_seconds),
        "assignment_seconds": pool.assignment_seconds,
        "min_stake": pool.stake,
        # How samples are drawn and scored; max_new_tokens also bounds an upload before
        # it is decoded, with the prompt's share of the context.
        **scoring_settings(cfg),
        "max_prompt_tokens": max(1, CONTEXT_TOKENS - cfg.sampling.max_new_tokens),
    }


def orchestrator_settings(cfg: RunConfig, **deployment: Any) -> OrchestratorConfig:
    """The orchestrator's settings for the run `cfg`. `deployment` gives what a run config
    does not hold (ledger, store, secret_file, allowlist, owner, ...) and wins over what
    is derived. Raises ValidationError when a setting is invalid."""
    return OrchestratorConfig.model_validate(run_settings(cfg) | deployment)


def load_orchestrator_config(
    tree: dict[str, Any], flags: dict[str, Any], source: str
) -> OrchestratorConfig:
    """`tree` (read from `source`: a settings file, or derived from a run config) with
    `flags` over it. Raises ConfigError with one line naming the field and where it came
    from: `--flag-name` for a flag, `SOURCE: field` otherwise."""
    try:
        return OrchestratorConfig.model_validate(tree | flags)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        where = (
            "--" + name.replace("_", "-")
            if name in flags
            else f"{source}: {name}"
            if name
            else source
        )
        got = f" (got {json.dumps(first['input'], default=str)})" if name else ""
        what = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid config: {where}: {what}{got}") from None


def read_orchestrator_config(path: Path) -> dict[str, Any]:
    """The settings in a TOML (or JSON) file, unvalidated (`load_orchestrator_config`)."""
    tree = read_config_file(path, example="<run>/orchestrator/config.toml")
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {path} is not a table of settings")
    return tree


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else "inf" if value == math.inf else repr(value)
    # JSON's string escapes are TOML's, but for DEL, which TOML wants escaped too.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def write_orchestrator_config(config: OrchestratorConfig, path: Path) -> None:
    """Write every setting (unset ones left out) as TOML, each under its help text, to a
    temporary name renamed into place: the file `--config` reads."""
    lines = [
        "# The orchestrator's settings; serve them with: swarmrl orchestrator --config "
        f"{Path(path).name}",
        "# (any flag given beside --config overrides the value here)",
    ]
    for name, field in OrchestratorConfig.model_fields.items():
        value = getattr(config, name)
        if value is not None:
            lines += ["", f"# {field.description}", f"{name} = {_toml_value(value)}"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
