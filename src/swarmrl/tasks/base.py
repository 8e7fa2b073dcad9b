"""The task interface: where prompts come from and how a completion is scored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    `answer` is whatever the task's verifier needs: the reference answer for math and
    arithmetic, the test code for the code task.
    """

    problem_id: str
    question: str
    answer: str


class Task(Protocol):
    """A prompt source plus a verifier. Implementations are deterministic: the same
    index always gives the same problem, so a validator can recompute assignments."""

    name: str

    def num_train(self) -> int:
        """How many training problems `train_problem` can index."""
        ...

    def train_problem(self, index: int) -> Problem:
        """The training problem at `index` (0 <= index < num_train())."""
        ...

    def eval_problems(self) -> list[Problem]:
        """The fixed held-out evaluation split (never returned by train_problem)."""
        ...

    def render_prompt(self, problem: Problem, target_length: int | None) -> str:
        """The prompt text the model sees; states the target length when one is given."""
        ...

    def score(self, problem: Problem, completion: str) -> float:
        """Task reward of a completion: 1.0 if verified correct, else 0.0."""
        ...
