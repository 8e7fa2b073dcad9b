"""The pool's recipe, stated once: what every member must agree on with the orchestrator.

The orchestrator's settings and each member's run config repeat a few values (run id,
steps, batch samples, prompts per assignment, group size, async level, and how samples
are drawn and scored: temperature, top_p, max_new_tokens, the task and its length
reward). Where two disagree the pool hangs without a word (every upload of a worker with
another run id is refused, and its assignments stay open until their deadline), or
worse: a worker that samples or scores otherwise than the validator writes files the
validator rejects, and is slashed for honest work. So the orchestrator
serves its recipe (`GET /v1/recipe`), each member sends its own with its registration,
and a member whose recipe differs is refused there (409), with one line naming both
values; `swarmrl status` lists the refusal and its reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swarmrl.protocol.models import Recipe, Role

if TYPE_CHECKING:
    from swarmrl.config import RunConfig, TaskConfig
    from swarmrl.orchestrator.config import OrchestratorConfig

# Each recipe field, and the run config's field that sets it on a member.
MEMBER_FIELD = {
    "run_id": "run_name",
    "steps": "trainer.steps",
    "batch_samples": "trainer.batch_samples",
    "prompts_per_assignment": "worker.prompts_per_file",
    "group_size": "sampling.group_size",
    "async_level": "async_level",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "max_new_tokens": "sampling.max_new_tokens",
    "task": "task.name",
    "target_lengths": "task.target_lengths",
    "length_alpha": "task.length_alpha",
    "length_alpha_start": "task.length_alpha_start",
    "length_alpha_steps": "task.length_alpha_steps",
    "length_shaping": "task.length_shaping",
    "advantage_mode": "task.advantage_mode",
}


# Fields where a member's value may lie below the pool's (`differences`).
AT_MOST = ("steps", "batch_samples")

# What the trainer, a worker and the validator must agree on to judge a file alike: the
# prompts an assignment's seed gives, how its samples are drawn and how they are scored.
# A worker that samples at another temperature, or scores with another length
# coefficient, writes files the validator rejects: honest work, slashed.
_SCORING = (
    "max_new_tokens",
    "task",
    "target_lengths",
    "length_alpha",
    "length_alpha_start",
    "length_alpha_steps",
    "length_shaping",
    "advantage_mode",
)

# The fields each role reads, so the ones it states: a member is never refused over a
# value it does not use (a worker's trainer.steps, say; the trainer's top_p: it never
# samples).
ROLE_FIELDS: dict[Role, tuple[str, ...]] = {
    "trainer": (
        "run_id",
        "steps",
        "batch_samples",
        "group_size",
        "async_level",
        "temperature",
        *_SCORING,
    ),
    "worker": (
        "run_id",
        "prompts_per_assignment",
        "group_size",
        "async_level",
        "temperature",
        "top_p",
        *_SCORING,
    ),
    "validator": (
        "run_id",
        "prompts_per_assignment",
        "group_size",
        "temperature",
        "top_p",
        *_SCORING,
    ),
}


def target_lengths(lengths: list[int]) -> str:
    """A task's target lengths as a recipe states them: comma-separated ("" for none)."""
    return ",".join(str(n) for n in lengths)


def length_curriculum(task: TaskConfig) -> tuple[float, int]:
    """(coefficient at step 0, steps to length_alpha) as a recipe states them: a task
    without a curriculum, or with one of 0 steps, states (length_alpha, 0), so two configs
    that score every step alike state the same."""
    if task.length_alpha_start is None or task.length_alpha_steps == 0:
        return task.length_alpha, 0
    return task.length_alpha_start, task.length_alpha_steps


def scoring_settings(cfg: RunConfig) -> dict[str, Any]:
    """The run config's sampling and scoring values, under the recipe's names (the
    orchestrator's settings take the same names)."""
    start, steps = length_curriculum(cfg.task)
    return {
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "max_new_tokens": cfg.sampling.max_new_tokens,
        "task": cfg.task.name,
        "target_lengths": target_lengths(cfg.task.target_lengths),
        "length_alpha": cfg.task.length_alpha,
        "length_alpha_start": start,
        "length_alpha_steps": steps,
        "length_shaping": cfg.task.length_shaping,
        "advantage_mode": cfg.task.advantage_mode,
    }


def of_run(cfg: RunConfig, role: Role) -> Recipe:
    """A member's recipe, from its run config: the fields its role reads, the others None
    (`trainer.steps` 0 means no limit)."""
    full = Recipe(
        run_id=cfg.run_name,
        steps=cfg.trainer.steps or None,
        batch_samples=cfg.trainer.batch_samples,
        prompts_per_assignment=cfg.worker.prompts_per_file,
        group_size=cfg.sampling.group_size,
        async_level=cfg.async_level,
        **scoring_settings(cfg),
    )
    return Recipe(**full.model_dump(include=set(ROLE_FIELDS[role])))


def of_pool(config: OrchestratorConfig) -> Recipe:
    """The orchestrator's recipe (a setting left unset is not checked)."""
    return Recipe(**{name: getattr(config, name) for name in Recipe.model_fields})


def differences(pool: Recipe, member: Recipe) -> list[str]:
    """`field: the pool's X, this member's Y (its config's F)` for each field where both
    state a value and they differ (a pool without a run id or steps checks none).

    steps and batch_samples are bounds, not values to match: a trainer that stops before
    the pool's last step, or reads fewer samples a step than the pool issues, only
    leaves work unused (a run is resumed with more steps so); one that needs more than
    the pool issues waits forever."""
    out = []
    for name in Recipe.model_fields:
        ours, theirs = getattr(pool, name), getattr(member, name)
        if ours is None or theirs is None or ours == theirs:
            continue
        if name in AT_MOST and theirs < ours:
            continue
        out.append(
            f"{name}: the pool's is {ours!r}, this member's {theirs!r} "
            f"(its config's {MEMBER_FIELD[name]})"
        )
    return out
