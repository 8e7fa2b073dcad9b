"""What both the trainer and the validator recompute from a rollout file: the prompts an
assignment seed gives, whether the rows hold them, and the values (length penalties,
rewards, group advantages) that follow from verified task rewards.

Pure functions over the rows, one floor below both roles: the validator runs them as
two of its checks (``validator.checks``), the trainer to refuse a file that is not its
assignment and to train on its own numbers (``trainer.rescoring``). The worker
(``generation.rollout``) renders prompts and decodes completions with the same two
functions, so all three roles see the same tokens and text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmrl.assignment import assign_from_seed
from swarmrl.config import RunConfig
from swarmrl.rewards import (
    DEFAULT_SHAPING,
    AdvantageMode,
    LengthShaping,
    length_penalty,
    shaped_advantages,
)
from swarmrl.rollouts import Rollouts
from swarmrl.tasks.base import Problem, Task


def prompt_ids(tokenizer, task: Task, problem: Problem, target: int | None) -> list[int]:
    """The prompt's token ids; a target length of None or -1 (the column's "none") means no target."""
    rendered = task.render_prompt(problem, target if target is not None and target >= 0 else None)
    return tokenizer(rendered)["input_ids"]


def completion_text(tokenizer, tokens: list[int], eos_id: int) -> str:
    """The text the task's verifier scores: the completion decoded, without a final EOS."""
    body = tokens[:-1] if tokens and tokens[-1] == eos_id else tokens
    return tokenizer.decode(body, skip_special_tokens=True)


@dataclass(frozen=True)
class CheckFailure:
    """One failing sample of one check (sample None: the file as a whole)."""

    check: str
    sample: int | None
    detail: str


@dataclass(frozen=True)
class CheckResult:
    name: str
    failures: tuple[CheckFailure, ...] = ()
    figures: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class ExpectedPrompt:
    """What the assignment says row i must hold."""

    problem_id: str
    input_tokens: list[int]
    target_length: int
    seed: int


def check_result(name: str, failures: list[CheckFailure], **figures) -> CheckResult:
    """The result of check `name` from its failures, in order, and its figures."""
    return CheckResult(name, tuple(failures), figures)


def expected_prompts(
    cfg: RunConfig, seed: int, task: Task, tokenizer
) -> tuple[list[ExpectedPrompt], dict[str, Problem]]:
    """Row by row, what the assignment seed gives; and the assigned problems by id."""
    plan = assign_from_seed(
        seed,
        num_problems=task.num_train(),
        prompts=cfg.worker.prompts_per_file,
        group_size=cfg.sampling.group_size,
        target_lengths=cfg.task.target_lengths,
    )
    expected: list[ExpectedPrompt] = []
    problems: dict[str, Problem] = {}
    for index, target, seeds in zip(
        plan.problem_indices, plan.target_lengths, plan.sample_seeds, strict=True
    ):
        problem = task.train_problem(index)
        problems[problem.problem_id] = problem
        ids = prompt_ids(tokenizer, task, problem, target)
        expected.extend(
            ExpectedPrompt(problem.problem_id, ids, target, sample_seed) for sample_seed in seeds
        )
    return expected, problems


def check_assignment(rows: Rollouts, expected: list[ExpectedPrompt]) -> CheckResult:
    """Each row holds the prompt, target length and seed that the assignment seed gives it."""
    failures = []
    for i in range(min(len(rows), len(expected))):
        want = expected[i]
        if rows.problem_id[i] != want.problem_id:
            failures.append(
                CheckFailure(
                    "assignment",
                    i,
                    f"problem {rows.problem_id[i]!r}, the assignment gives {want.problem_id!r}",
                )
            )
        elif rows.input_tokens[i] != want.input_tokens:
            failures.append(
                CheckFailure(
                    "assignment",
                    i,
                    "prompt tokens differ from the assigned problem's rendered prompt",
                )
            )
        elif rows.target_lengths[i] != want.target_length:
            failures.append(
                CheckFailure(
                    "assignment",
                    i,
                    f"target length {rows.target_lengths[i]}, the assignment gives {want.target_length}",
                )
            )
        elif rows.seed[i] != want.seed:
            failures.append(
                CheckFailure(
                    "assignment", i, f"seed {rows.seed[i]}, the assignment gives {want.seed}"
                )
            )
    if len(rows) != len(expected):
        failures.append(
            CheckFailure(
                "assignment", None, f"{len(rows)} samples, the assignment has {len(expected)}"
            )
        )
    return check_result("assignment", failures)


def _close(stored: float, recomputed: float, tolerance: float) -> bool:
    # Written so that NaN in a stored value fails.
    return abs(float(stored) - float(recomputed)) <= tolerance


def check_values(
    rows: Rollouts,
    task_rewards: list[float],
    *,
    alpha: float,
    group_size: int,
    tolerance: float,
    shaping: LengthShaping = DEFAULT_SHAPING,
    advantage_mode: AdvantageMode = "joint",
) -> CheckResult:
    """Task rewards (recomputed by the caller), length penalties, totals and group advantages."""
    failures: dict[int, CheckFailure] = {}
    penalties = []
    for i in range(len(rows)):
        penalty = length_penalty(
            rows.target_lengths[i],
            len(rows.output_tokens[i]),
            alpha,
            task_reward=task_rewards[i],
            shaping=shaping,
        )
        total = task_rewards[i] - penalty
        penalties.append(penalty)
        for name, stored, want in (
            ("task reward", rows.task_rewards[i], task_rewards[i]),
            ("length penalty", rows.length_penalties[i], penalty),
            ("reward", rows.rewards[i], total),
        ):
            if i not in failures and not _close(stored, want, tolerance):
                failures[i] = CheckFailure(
                    "values", i, f"{name} {stored:.6g}, recomputed {want:.6g}"
                )
    for g in range(0, len(rows) - len(rows) % group_size, group_size):
        group = slice(g, g + group_size)
        want_adv = shaped_advantages(task_rewards[group], penalties[group], advantage_mode)
        for j, a in enumerate(want_adv):
            i = g + j
            if i not in failures and not _close(
                rows.advantages[i], a, tolerance * max(1.0, abs(float(a)))
            ):
                failures[i] = CheckFailure(
                    "values",
                    i,
                    f"advantage {rows.advantages[i]:.6g}, recomputed {a:.6g} from the group's rewards",
                )
    return check_result("values", [failures[i] for i in sorted(failures)])
