"""Request and response bodies of the orchestrator's API, shared by server and client.

Request models are strict (no coercion: `false` is no number, `"3"` no integer), forbid
unknown fields and bound every number and string: they parse what untrusted members send.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The pool's kinds, declared once: the ledger's constraints (ledger/models.py) are built
# from these, so the API and the tables cannot disagree on a role or a state.
Role = Literal["worker", "trainer", "validator", "relay"]
MemberStatus = Literal["healthy", "unhealthy", "dead"]  # by heartbeats
AssignmentState = Literal["issued", "returned", "lapsed"]
SubmissionState = Literal["pending", "accepted", "rejected", "voided"]
ROLES: tuple[Role, ...] = get_args(Role)
MEMBER_STATUSES: tuple[MemberStatus, ...] = get_args(MemberStatus)
ASSIGNMENT_STATES: tuple[AssignmentState, ...] = get_args(AssignmentState)
SUBMISSION_STATES: tuple[SubmissionState, ...] = get_args(SubmissionState)

# What kind of refusal a refused request met, in its body's `code` (docs/orchestrator.md
# lists them): programs branch on it, people read `detail`.
RefusalCode = Literal[
    "bad_signature",  # malformed signature headers, or a signature of another key
    "wrong_pool",  # signed for another pool: check the orchestrator URL
    "old_protocol",  # the client or the orchestrator speaks an older protocol: upgrade
    "stale_timestamp",  # outside the timestamp window, or signed before the key registered
    "replayed",  # the nonce was already used by this address
    "rate_limited",  # the sender is over its rate limit
    "not_registered",  # the key is no member: register
    "dead",  # declared dead after missed heartbeats: register again
    "ejected",  # a validator rejected the member's work: it is out of the pool for good
    "wrong_role",  # the member's role may not do this, or it registered as another role
    "not_allowed",  # not on the allowlist, not the pool owner, or another worker's assignment
    "recipe_mismatch",  # the member's recipe differs from the pool's (GET /v1/recipe)
    "stake_short",  # a worker's balance cannot cover the stake it must lock
    "not_found",  # no such assignment, submission or route
    "conflict",  # the ledger's state forbids it: closed, already decided, older checkpoint
    "late",  # the assignment passed its deadline: the work is void
    "bad_file",  # an uploaded file refused for what it holds: its assignment lapses
    "invalid",  # a request malformed or out of bounds
    "too_large",  # a body or file over its size limit
]
REFUSAL_CODES: tuple[RefusalCode, ...] = get_args(RefusalCode)


# A recipe's names (a task, a shaping, a mode) and its list of target lengths, as stated.
TOKEN = r"^[a-z][a-z0-9_]{0,31}$"
TARGET_LENGTHS = r"^([0-9]{1,7}(,[0-9]{1,7}){0,63})?$"


class _Request(BaseModel):
    # Strict: a member's `false` is not the step 0, nor its "3" the step 3.
    model_config = ConfigDict(extra="forbid", strict=True)


class Recipe(_Request):
    """What every member must agree on with the pool (protocol/recipe.py); None: not stated."""

    run_id: str | None = Field(
        None, max_length=255, description="run id every rollout file carries (run_name)"
    )
    steps: int | None = Field(
        None, ge=1, le=10**9, description="rollout steps of the run (trainer.steps)"
    )
    batch_samples: int | None = Field(
        None, ge=1, le=10**9, description="usable samples a step needs (trainer.batch_samples)"
    )
    prompts_per_assignment: int | None = Field(
        None, ge=1, le=10**6, description="prompts in one assignment (worker.prompts_per_file)"
    )
    group_size: int | None = Field(
        None, ge=1, le=10**6, description="samples per prompt (sampling.group_size)"
    )
    async_level: int | None = Field(
        None, ge=0, le=10**6, description="k: step n needs a policy >= n-k (async_level)"
    )
    # What decides whether an honest member's file passes the validator's checks: the
    # sampling it replays and the rewards it recomputes.
    temperature: float | None = Field(
        None, gt=0, le=1000, description="sampling temperature (sampling.temperature)"
    )
    top_p: float | None = Field(
        None, gt=0, le=1, description="nucleus sampling threshold (sampling.top_p)"
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=1 << 20, description="completion length limit (sampling.max_new_tokens)"
    )
    task: str | None = Field(None, pattern=TOKEN, description="the task's name (task.name)")
    target_lengths: str | None = Field(
        None,
        pattern=TARGET_LENGTHS,
        description="target completion lengths, comma-separated; empty: none (task.target_lengths)",
    )
    length_alpha: float | None = Field(
        None, ge=0, le=1e6, description="the length coefficient (task.length_alpha)"
    )
    length_alpha_start: float | None = Field(
        None,
        ge=0,
        le=1e6,
        description="the length coefficient at step 0 (task.length_alpha_start; length_alpha "
        "when there is no curriculum)",
    )
    length_alpha_steps: int | None = Field(
        None,
        ge=0,
        le=10**9,
        description="steps of the length curriculum (task.length_alpha_steps; 0: none)",
    )
    length_shaping: str | None = Field(
        None, pattern=TOKEN, description="how the length enters the reward (task.length_shaping)"
    )
    advantage_mode: str | None = Field(
        None, pattern=TOKEN, description="how a group's advantages are formed (task.advantage_mode)"
    )


class RegisterRequest(_Request):
    role: Role = Field(description="the role this key registers for")
    recipe: Recipe | None = Field(
        None,
        description="the member's recipe: refused (409) where it differs from the pool's "
        "(GET /v1/recipe); unset: not checked",
    )
    url: str | None = Field(
        None,
        max_length=512,
        pattern=r"^https?://[^\s]+$",
        description="relays: the URL workers fetch checkpoints from; trainer: its SHARDCAST origin",
    )


class Member(BaseModel):
    address: str
    role: Role
    status: MemberStatus | Literal["ejected"] = Field(
        description="healthy, unhealthy or dead (by heartbeats), or ejected"
    )
    url: str | None = None
    lapses: int = 0
    last_heartbeat: float | None = None
    balance: float = Field(0.0, description="funds the address holds, not locked")
    stake: float = Field(0.0, description="funds locked as the worker's stake")
    paid: float = Field(0.0, description="paid out for its work so far")
    unpaid: float = Field(0.0, description="credited work not paid yet (paid when its step ends)")


class HeartbeatRequest(_Request):
    policy_step: int | None = Field(
        None, ge=0, le=10**9, description="newest checkpoint step the member holds"
    )
    bytes_served: int | None = Field(
        None,
        ge=0,
        le=2**62,
        description="a SHARDCAST server (relay, the trainer's origin): bytes it has served since it started",
    )


class CheckpointInfo(BaseModel):
    step: int
    blake3: str


class HeartbeatResponse(BaseModel):
    step: int | None = Field(description="the step the trainer waits on (newest checkpoint's step)")
    async_level: int
    checkpoint: CheckpointInfo | None
    relays: list[str] = Field(description="URLs to fetch checkpoints from (healthy relays)")
    origin: str | None = Field(None, description="the trainer's SHARDCAST origin, if registered")
    heartbeat_seconds: float
    finished: bool = Field(description="the trainer published its final checkpoint")

    def checkpoint_servers(self, with_origin: bool) -> list[str]:
        """Where to fetch checkpoints: the healthy relays, then the trainer's origin —
        always (`with_origin`: it holds a new version first, and old ones a relay may have
        dropped) or only when no relay is registered (keeps the origin's load off workers)."""
        origin = [self.origin] if self.origin else []
        if with_origin:
            return [*self.relays, *origin]
        return list(self.relays) or origin


class AssignmentRequest(_Request):
    policy_step: int = Field(ge=0, le=10**9, description="newest checkpoint step the worker holds")


class AssignmentInfo(BaseModel):
    id: int
    worker: str
    step: int
    seed: int
    prompts: int
    group_size: int
    deadline: float


class AssignmentResponse(BaseModel):
    assignment: AssignmentInfo | None
    reason: str = Field("", description="why no assignment was issued")
    retry_seconds: float = 0.0


class SubmissionInfo(BaseModel):
    file_hash: str
    assignment_id: int
    worker: str
    step: int
    size: int
    num_samples: int
    num_nonzero: int
    num_tokens: int
    state: SubmissionState
    trained_step: int | None = None
    seed: int | None = Field(
        None, description="the assignment's seed (in the trainer's list: it rebuilds the prompts)"
    )


class SubmissionList(BaseModel):
    step: int
    submissions: list[SubmissionInfo]


class MarkTrainedRequest(_Request):
    step: int = Field(ge=0, le=10**9, description="the training step that consumed the files")
    file_hashes: list[str] = Field(min_length=1, max_length=10_000)


class MarkTrainedResponse(BaseModel):
    marked: int


class ValidationTask(BaseModel):
    submission: SubmissionInfo | None
    assignment: AssignmentInfo | None = None


class VerdictRequest(_Request):
    file_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    accepted: bool
    reason: str = Field("", max_length=4000, description="the failed check, or empty")
    soft: bool = Field(
        False,
        description="not judged, through no proven fault (e.g. its checkpoint was pruned): "
        "the file is voided without slashing; needs accepted=false",
    )

    @model_validator(mode="after")
    def _soft_is_not_accepted(self) -> VerdictRequest:
        if self.soft and self.accepted:
            raise ValueError("a soft verdict voids the file: accepted must be false")
        return self


class VerdictResponse(BaseModel):
    file_hash: str
    state: SubmissionState


class CheckpointAnnouncement(_Request):
    step: int = Field(ge=0, le=10**9)
    blake3: str = Field(pattern=r"^[0-9a-f]{64}$", description="BLAKE3 of the broadcast file")
    final: bool = Field(False, description="the run's last checkpoint: no more work after it")


class ProgressReport(_Request):
    usable: int = Field(
        ge=0, le=10**9, description="usable samples of the step, by the trainer's own count"
    )
    read: int = Field(ge=0, le=10**9, description="samples of the step the trainer has read")
    files: list[str] = Field(
        default_factory=list,
        max_length=10_000,
        description="hashes of the submissions these counts cover",
    )
    full: bool = Field(False, description="the trainer has all it needs for this step")


class MetricsReport(_Request):
    """The trainer's step metrics for the dashboard's learning curves (one trained step).
    A measure that was not finite (a diverged update) or not measured is None."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    step: int = Field(ge=0, le=10**9, description="the rollout step trained")
    reward: float | None = Field(ge=-1e6, le=1e6, description="mean reward of the samples read")
    task_reward: float | None = Field(ge=-1e6, le=1e6, description="mean task reward")
    length_error: float | None = Field(
        None, ge=0, le=1e9, description="mean |target - length|; None without targets"
    )
    grad_norm: float | None = Field(ge=0, le=1e12, description="mean gradient norm before clipping")
    clip_ratio: float | None = Field(ge=0, le=1, description="fraction of tokens clipped")
    entropy: float | None = Field(ge=-1e6, le=1e6)
    staleness_mean: float = Field(ge=0, le=1e9, description="mean n - policy_step trained")
    staleness_max: int = Field(ge=0, le=10**9)
    samples: int = Field(ge=0, le=10**9, description="samples trained on")
    step_seconds: float = Field(ge=0, le=1e9)
    heldout_accuracy: float | None = Field(
        None, ge=0, le=1, description="held-out pass@1 of the checkpoint, where evaluated"
    )


class StepStatus(BaseModel):
    step: int
    target_samples: int
    usable_samples: int = Field(
        description="the trainer's count for the files it read, workers' claims for the rest"
    )
    read_samples: int | None = Field(None, description="samples the trainer reported read")
    submissions: int
    open_assignments: int
    lapsed_assignments: int
    trained: int
    full: bool


class Contribution(BaseModel):
    worker: str
    files: int
    samples: int
    tokens: int


class FundRequest(_Request):
    address: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$", description="the address to fund")
    amount: float = Field(gt=0, le=1e9, description="added to the address's balance")


class Account(BaseModel):
    address: str
    balance: float
    stake: float


class Slashing(BaseModel):
    """A worker caught: its stake slashed, its untrained files voided, its trained ones tainted."""

    address: str
    at: float = Field(description="unix time of the verdict")
    step: int = Field(description="the rejected file's step")
    file_hash: str = Field(description="the rejected file")
    reason: str = Field(description="the validator's reason, naming the failed check")
    slashed: float = Field(description="stake taken")
    voided_files: int = Field(description="its untrained files voided")
    tainted_files: int = Field(description="its files already trained")
    tainted_steps: list[int] = Field(description="the training steps that used them")


class RefusedRegistration(BaseModel):
    """A registration the pool refused, newest per address (kept since the orchestrator
    started, at most `orchestrator.refusals.REFUSALS_KEPT`)."""

    address: str
    role: str
    at: float = Field(description="unix time of the newest refusal")
    reason: str


class PoolStatus(BaseModel):
    step: int | None
    recipe: Recipe | None = Field(None, description="what members must agree on")
    checkpoint: CheckpointInfo | None
    finished: bool
    members: list[Member]
    steps: list[StepStatus]
    submissions: dict[str, int] = Field(
        description="files by state: pending, accepted (by a validator, not trained yet), "
        "trained, rejected, voided"
    )
    verdicts: dict[str, int]
    contributions: list[Contribution]
    slashings: list[Slashing] = Field(default_factory=list, description="oldest first")
    refusals: list[RefusedRegistration] = Field(
        default_factory=list, description="refused registrations, newest first"
    )


class Problem(BaseModel):
    """A refused request's body: what kind of refusal, and why in one line."""

    code: RefusalCode = Field(description="the kind of refusal, for programs to branch on")
    detail: str = Field(description="what was wrong and what to do, for people")


class SigningInfo(BaseModel):
    """What every signed request to this pool must sign (docs/orchestrator.md)."""

    protocol: str = Field(description="the signed text's first line, e.g. swarmrl/2")
    pool: str = Field(description="the pool id: the signed text's second line, and X-Pool")


def failed_check(reason: str) -> str:
    """The check a verdict's reason names: 'rejected: toploc: sample 3: ...' -> 'toploc';
    an unusable file ('unusable: ...') -> 'unusable'."""
    parts = reason.split(": ", 2)
    return parts[1] if parts[0] == "rejected" and len(parts) > 1 else parts[0]
