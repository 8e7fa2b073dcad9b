"""The pool's recipe, stated once: what every member must agree on with the orchestrator.

The orchestrator's settings and each member's run config repeat a few values (run id,
steps, batch samples, prompts per assignment, group size, async level). Where two
disagree the pool hangs without a word: every upload of a worker with another run id
is refused, and its assignments stay open until their deadline. So the orchestrator
serves its recipe (`GET /v1/recipe`), each member sends its own with its registration,
and a member whose recipe differs is refused there (409), with one line naming both
values; `swarmrl status` lists the refusal and its reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmrl.protocol.models import Recipe, Role

if TYPE_CHECKING:
    from swarmrl.config import RunConfig
    from swarmrl.orchestrator.config import OrchestratorConfig

# Each recipe field, and the run config's field that sets it on a member.
MEMBER_FIELD = {
    "run_id": "run_name",
    "steps": "trainer.steps",
    "batch_samples": "trainer.batch_samples",
    "prompts_per_assignment": "worker.prompts_per_file",
    "group_size": "sampling.group_size",
    "async_level": "async_level",
}


# Fields where a member's value may lie below the pool's (`differences`).
AT_MOST = ("steps", "batch_samples")

# The fields each role reads, so the ones it states: a member is never refused over a
# value it does not use (a worker's trainer.steps, say).
ROLE_FIELDS: dict[Role, tuple[str, ...]] = {
    "trainer": ("run_id", "steps", "batch_samples", "group_size", "async_level"),
    "worker": ("run_id", "prompts_per_assignment", "group_size", "async_level"),
    "validator": ("run_id", "prompts_per_assignment", "group_size"),
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
    )
    return Recipe(**full.model_dump(include=set(ROLE_FIELDS[role])))


def of_pool(config: OrchestratorConfig) -> Recipe:
    return Recipe(
        run_id=config.run_id,
        steps=config.steps,
        batch_samples=config.batch_samples,
        prompts_per_assignment=config.prompts_per_assignment,
        group_size=config.group_size,
        async_level=config.async_level,
    )


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
