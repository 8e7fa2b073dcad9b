"""The embedded default task: three-digit addition worked digit by digit.

A completion works the sum from the units up, one fixed-width step per digit
(`<digit a>+<digit b>+<carry in>=<two-digit sum>;`), then gives the answer after a
final `=`. Fixed-width steps keep the copy from scratchpad to answer at constant
offsets, which a tiny transformer learns in a short supervised run.

Two things are left for RL to fix, both on purpose (`demonstration`):
- the demonstrations forget an incoming carry with probability `carry_drop`, so the
  warm-started model drops carries and gets many sums wrong;
- they restate the problem before working (`(347+285)`, "verbose", 9 tokens longer)
  at random, ignoring the target length the prompt asks for, so the length error is
  large until RL conditions that choice on the target.

The prompt ends with the target (`347+285 think 41`, nothing after it), right where the
completion starts, so the choice of restating or not sits next to what it should depend
on, and it is made at one token: a restatement opens with `(`, which no worked step
does. (A restatement that opened with the first digit, `347+285:`, left the choice to
the second token whenever a's first and last digits agree, one problem in ten; RL
learned it there far more slowly, and those problems made most of the length error
left after training.)

Training problems are every pair outside the held-out split, or, with a problem file
(`path`: JSONL or Parquet rows with integer `a` and `b`, e.g. the prompt set written by
`swarmrl filter`), the file's pairs. The held-out split is the same either way: it is
fixed by `eval_size` and `eval_seed`, never by the file, and a file's pair that lies in
it is dropped from training.
"""

from __future__ import annotations

import bisect
import logging
import random
from pathlib import Path

from swarmrl.tasks.base import Problem
from swarmrl.tasks.loading import Field, ProblemFileError, load_rows

logger = logging.getLogger(__name__)

LOW, HIGH = 100, 999
SPAN = HIGH - LOW + 1
DIGITS = 3

# A problem file's columns; `id`, `pass_rate` and any other column are ignored.
FIELDS = {
    "a": Field(names=("a",), types=(int,)),
    "b": Field(names=("b",), types=(int,)),
}


def worked_solution(
    a: int, b: int, *, drop_carries: list[bool] | None = None, verbose: bool = False
) -> str:
    """The scratchpad and answer for a+b. `drop_carries[i]` forgets the carry into digit i."""
    steps, carry, digits = [], 0, []
    for i in range(DIGITS):
        da, db = a // 10**i % 10, b // 10**i % 10
        if drop_carries is not None and drop_carries[i]:
            carry = 0
        total = da + db + carry
        steps.append(f"{da}+{db}+{carry}={total:02d};")
        digits.append(str(total % 10))
        carry = total // 10
    answer = ("1" if carry else "") + "".join(reversed(digits))
    prefix = f"({a}+{b})" if verbose else ""
    return prefix + "".join(steps) + "=" + answer


def parse_answer(completion: str) -> int | None:
    """The answer: the integer after the `;=` that ends the worked steps, else None."""
    if ";=" not in completion:
        return None
    tail = completion.rsplit(";=", 1)[1].strip()
    return int(tail) if tail.isdigit() and len(tail) <= 8 else None


class ArithmeticTask:
    """Three-digit addition: 810,000 problems, a fixed held-out split of `eval_size`;
    training on all the others, or on the pairs of a problem file (`path`)."""

    name = "arithmetic"

    def __init__(
        self, eval_size: int = 256, eval_seed: int = 1234, path: str | Path | None = None
    ) -> None:
        total = SPAN * SPAN
        picked = random.Random(eval_seed).sample(range(total), eval_size)
        self._eval_codes = sorted(picked)
        self._total = total
        self._file_codes = None if path is None else self._read_codes(Path(path))

    def _read_codes(self, path: Path) -> list[int]:
        codes: list[int] = []
        seen: set[int] = set()
        held_out = 0
        for number, row in enumerate(load_rows(path, FIELDS), start=1):
            a, b = row["a"], row["b"]
            assert isinstance(a, int) and isinstance(b, int)  # FIELDS accept integers only
            if not (LOW <= a <= HIGH and LOW <= b <= HIGH):
                raise ProblemFileError(
                    f"{path}: problem {number} ({a}+{b}): a and b must be three-digit "
                    f"integers in [{LOW}, {HIGH}]"
                )
            code = (a - LOW) * SPAN + (b - LOW)
            if code in seen:
                raise ProblemFileError(f"{path}: problem {number} ({a}+{b}) appears twice")
            seen.add(code)
            if self._is_held_out_code(code):
                held_out += 1
                continue
            codes.append(code)
        if held_out:
            logger.warning(
                "%s: %d of its problems are in the held-out split and are not trained on",
                path,
                held_out,
            )
        if not codes:
            raise ProblemFileError(f"{path}: every problem is in the held-out split")
        return codes

    @staticmethod
    def _problem(code: int) -> Problem:
        a, b = LOW + code // SPAN, LOW + code % SPAN
        return Problem(problem_id=f"add-{a}-{b}", question=f"{a}+{b}", answer=str(a + b))

    def num_train(self) -> int:
        if self._file_codes is not None:
            return len(self._file_codes)
        return self._total - len(self._eval_codes)

    def train_problem(self, index: int) -> Problem:
        if not 0 <= index < self.num_train():
            raise IndexError(f"train index {index} out of range [0, {self.num_train()})")
        if self._file_codes is not None:
            return self._problem(self._file_codes[index])
        # Map the index onto the codes that are not held out: skip each eval code at or
        # below the running position (the eval codes are sorted).
        code = index
        for held_out in self._eval_codes:
            if held_out <= code:
                code += 1
            else:
                break
        return self._problem(code)

    def eval_problems(self) -> list[Problem]:
        return [self._problem(code) for code in self._eval_codes]

    def is_held_out(self, problem: Problem) -> bool:
        a, b = (int(x) for x in problem.question.split("+"))
        return self._is_held_out_code((a - LOW) * SPAN + (b - LOW))

    def _is_held_out_code(self, code: int) -> bool:
        i = bisect.bisect_left(self._eval_codes, code)
        return i < len(self._eval_codes) and self._eval_codes[i] == code

    def render_prompt(self, problem: Problem, target_length: int | None) -> str:
        if target_length is None:
            return f"{problem.question}\n"
        # No separator after the target: the completion's first token, which decides
        # whether the problem is restated (8 tokens longer), is predicted at the target's
        # last digit, so the choice reads the target from its own position. Behind a
        # newline the warm start learned to ignore the target, and RL did not undo that in
        # 50 steps (docs/trainer.md, length control).
        return f"{problem.question} think {target_length}"

    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if parse_answer(completion) == int(problem.answer) else 0.0

    def demonstration(
        self, problem: Problem, rng: random.Random, carry_drop: float, verbose_prob: float
    ) -> str:
        """An imperfect worked solution, as used for the warm start (see module docstring)."""
        a, b = (int(x) for x in problem.question.split("+"))
        drops = [rng.random() < carry_drop for _ in range(DIGITS)]
        return worked_solution(a, b, drop_carries=drops, verbose=rng.random() < verbose_prob)
