"""The math task: the user's question/answer files, scored by comparing the last
`\\boxed{...}` of a completion with the reference answer symbolically (math-verify).

Design choices:
- Only the last complete `\\boxed{...}` counts (braces balanced, `\\{` and `\\}` skipped),
  as in INTELLECT-2: the model may box drafts while reasoning; its final answer is the
  last one. No box, or a box over `MAX_ANSWER_CHARS` characters, scores 0.0 without
  being parsed.
- Both sides are wrapped as `\\boxed{...}` and parsed by `math_verify.parse`, then
  compared by `math_verify.verify(reference, candidate)` (the reference goes first: the
  comparison is not symmetric). So `\\frac{1}{2}`, `1/2` and `0.5` are equal, and so are
  `x=3` and `3`. A reference answer may itself be written as `\\boxed{...}`.
- Threads. math-verify bounds each parse and comparison with `signal.alarm`, which only
  works on the main thread; with its timeouts off (`parsing_timeout=None`,
  `timeout_seconds=None`) it runs anywhere but can spin forever on answers like
  `9^{9^{9^{9}}}`, sometimes inside C code no signal interrupts. So every comparison
  runs in a helper process that calls math-verify on its own main thread with its
  per-operation timeouts (`verify_timeout_s`), while the caller waits at most
  `_OPERATIONS * verify_timeout_s + _DEADLINE_SLACK_S` seconds and kills the helper if
  it has not answered. A comparison cut short by either timeout scores 0.0 and is
  logged (math-verify's own timeouts on the helper's stderr). Helpers are reused;
  there is one per thread scoring at the same time, so `score` is safe and parallel
  across threads. The first call pays about a second to start a helper.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from swarmrl.tasks.base import Problem
from swarmrl.tasks.loading import Field, FileTask, load_problems

logger = logging.getLogger(__name__)

INSTRUCTION = "Put your final answer within \\boxed{}."
MAX_ANSWER_CHARS = 1000
BOX = "\\boxed{"

FIELDS = {
    "question": Field(names=("question", "problem", "prompt"), types=(str,)),
    "answer": Field(names=("answer",), types=(str, int, float)),
    "id": Field(names=("id",), types=(str, int), required=False),
}

# Two parses (reference, candidate) and up to 2x2 comparisons (math-verify keeps a
# parsed expression and its source text for each side), each with its own timeout.
_OPERATIONS = 6
_DEADLINE_SLACK_S = 5.0
_STARTUP_TIMEOUT_S = 120.0


class MathTask(FileTask):
    """Question/answer problems from a JSONL or Parquet file, verified with math-verify.

    Rows: `question` (or `problem`, or `prompt`): the problem text; `answer`: the
    reference answer (LaTeX or plain, e.g. `\\frac{1}{2}`, `0.5`, `x=3`; numbers are
    accepted); `id` (optional): a unique problem id, default `<file stem>-<row index>`.
    """

    name = "math"
    instruction = INSTRUCTION

    def __init__(
        self,
        path: str | Path,
        eval_path: str | Path | None = None,
        eval_size: int | None = None,
        verify_timeout_s: int = 5,
    ) -> None:
        """
        path: the training problems (`.jsonl` or `.parquet`).
        eval_path: a separate file of held-out problems; all of it is the eval split.
        eval_size: without `eval_path`, hold out the last `eval_size` problems of
            `path` (None: a tenth, at least one). Must be None when `eval_path` is set.
        verify_timeout_s: math-verify's timeout for each parse and comparison, in whole
            seconds (it uses signal.alarm); see the module docstring for the hard limit.
        """
        if verify_timeout_s < 1:
            raise ValueError(
                f"verify_timeout_s must be a whole number of seconds >= 1, got {verify_timeout_s}"
            )
        self.verify_timeout_s = verify_timeout_s
        self._split = load_problems(
            path,
            eval_path=eval_path,
            eval_size=eval_size,
            fields=FIELDS,
            make_problem=_make_problem,
        )

    def score(self, problem: Problem, completion: str) -> float:
        candidate = last_boxed(completion)
        if candidate is None or not candidate.strip() or len(candidate) > MAX_ANSWER_CHARS:
            return 0.0
        reference = last_boxed(problem.answer) or problem.answer
        return 1.0 if _HELPERS.same(reference, candidate, self.verify_timeout_s) else 0.0


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` in `text`, or None if there is none.

    Braces must balance; `\\{` and `\\}` (and any other backslash pair) are skipped. A
    trailing box whose braces never close (a cut-off completion) is ignored.
    """
    start = text.rfind(BOX)
    while start != -1:
        content_start = start + len(BOX)
        depth, i = 1, content_start
        while i < len(text):
            char = text[i]
            if char == "\\":
                i += 2
                continue
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[content_start:i]
            i += 1
        start = text.rfind(BOX, 0, start)
    return None


def answers_match(reference: str, candidate: str, timeout_s: int | None) -> bool:
    """Whether `candidate` equals `reference` by math-verify. Runs in this process: only
    call it on the main thread with a timeout, or with timeout_s=None and no bound."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = parse(BOX + reference + "}", extraction_config=config, parsing_timeout=timeout_s)
    if not gold:
        return False
    target = parse(BOX + candidate + "}", extraction_config=config, parsing_timeout=timeout_s)
    return bool(target) and verify(gold, target, timeout_seconds=timeout_s)


def _make_problem(row: dict[str, object], default_id: str) -> Problem:
    problem_id = default_id if row["id"] is None else str(row["id"])
    return Problem(
        problem_id=problem_id,
        question=str(row["question"]).strip(),
        answer=str(row["answer"]).strip(),
    )


def _serve() -> None:
    """The helper process's loop: one JSON request per stdin line, `1` or `0` back."""
    import math_verify  # noqa: F401  (import before reporting ready: it takes a while)

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        same = answers_match(request["reference"], request["candidate"], request["timeout_s"])
        sys.stdout.write("1\n" if same else "0\n")
        sys.stdout.flush()


class _Helper:
    """One helper process (see the module docstring) and its reply pipe."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        source = (
            f"import sys; sys.path.insert(0, {package_root!r}); "
            "from swarmrl.tasks.math import _serve; _serve()"
        )
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._pending = b""
        weakref.finalize(self, _stop, self._process, os.getpid())
        if self._read_line(time.monotonic() + _STARTUP_TIMEOUT_S) != "ready":
            self.stop()
            raise RuntimeError(
                "the math-verify helper process did not start (its error, if any, is on "
                f"stderr above); check that `{sys.executable} -c 'import math_verify'` works"
            )

    def same(self, reference: str, candidate: str, timeout_s: int, deadline: float) -> bool | None:
        """The helper's verdict, or None if it did not answer by `deadline`."""
        request = json.dumps(
            {"reference": reference, "candidate": candidate, "timeout_s": timeout_s}
        )
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(request.encode() + b"\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            return None
        reply = self._read_line(deadline)
        return None if reply is None else reply == "1"

    def stop(self) -> None:
        _stop(self._process, os.getpid())

    def _read_line(self, deadline: float) -> str | None:
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:  # the helper died
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode()


def _stop(process: subprocess.Popen[bytes], owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked copy of this object: the helper is not ours
        return
    process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


class _HelperPool:
    """Idle helpers, shared by every MathTask in this process; one is taken per call."""

    def __init__(self) -> None:
        self._idle: list[_Helper] = []
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()

    def same(self, reference: str, candidate: str, timeout_s: int) -> bool:
        with self._lock:
            if os.getpid() != self._owner_pid:  # forked: the parent's pipes are not ours
                self._idle, self._owner_pid = [], os.getpid()
            helper = self._idle.pop() if self._idle else None
        if helper is None:
            helper = _Helper()
        hard_limit_s = _OPERATIONS * timeout_s + _DEADLINE_SLACK_S
        verdict = helper.same(reference, candidate, timeout_s, time.monotonic() + hard_limit_s)
        if verdict is None:
            helper.stop()
            logger.warning(
                "math-verify gave no verdict within %.0f s comparing %.80r with reference "
                "%.80r; scored 0.0 and restarted its helper process",
                hard_limit_s,
                candidate,
                reference,
            )
            return False
        with self._lock:
            self._idle.append(helper)
        return verdict


_HELPERS = _HelperPool()
