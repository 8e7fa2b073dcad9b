"""The orchestrator's settings: typed, each with its help text (the CLI flags follow them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
        128, ge=1, description="usable (non-zero-advantage) samples a step needs"
    )
    prompts_per_assignment: int = Field(8, ge=1, description="prompts in one assignment")
    group_size: int = Field(8, ge=2, description="samples per prompt")
    async_level: int = Field(2, ge=0, description="k: a step-n assignment needs a policy >= n-k")
    max_ahead: int = Field(
        1,
        ge=0,
        description="issue work for at most this many steps past the newest checkpoint "
        "(within the async bound): lower staleness, at the cost of idle workers",
    )
    surplus: float = Field(
        0.1,
        ge=0,
        le=1,
        description="extra share of a step's need issued to cover lapses and rejects",
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
        600.0,
        gt=0,
        description="deadline of an assignment; then it lapses (counted against the worker)",
    )
    heartbeat_seconds: float = Field(10.0, gt=0, description="interval members heartbeat at")
    unhealthy_after: int = Field(
        3, ge=1, description="missed heartbeats before a member is unhealthy"
    )
    dead_after: int = Field(
        6, ge=1, description="missed heartbeats before a member is dead (its assignments reissued)"
    )
    timestamp_window: float = Field(
        60.0, gt=0, description="seconds a signed request's timestamp may differ from the clock"
    )
    rate_per_second: float = Field(20.0, gt=0, description="requests per second per address")
    rate_burst: int = Field(60, ge=1, description="requests an address may send in one burst")
    max_upload_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="largest rollout file accepted"
    )
    max_new_tokens: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="completion tokens a sample may hold (the run's sampling.max_new_tokens): "
        "with the assignment's rows, bounds what an upload may decode to",
    )
    max_prompt_tokens: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="prompt tokens a sample may hold (the model's context less max_new_tokens)",
    )
    validation_fraction: float = Field(
        0.1,
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
        description="stake a worker locks from its balance to register (0: no stake, a closed "
        "or free pool)",
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
