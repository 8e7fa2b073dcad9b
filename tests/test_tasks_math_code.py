"""The math and code tasks: loading user files, the eval split, and both verifiers."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.tasks import math as math_task
from swarmrl.tasks.base import Problem
from swarmrl.tasks.code import CodeTask, SandboxResult, extract_solution, run_solution
from swarmrl.tasks.loading import ProblemFileError
from swarmrl.tasks.math import MathTask, last_boxed

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def math_rows(count: int) -> list[dict[str, object]]:
    return [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(count)]


# ----------------------------------------------------------------------------- loading


def test_jsonl_and_parquet_give_the_same_problems(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "question": "1+1?", "answer": "2"},
        {"problem": "Half of one?", "answer": 0.5},
        {"prompt": "Two squared?", "answer": 4, "extra": "ignored"},
        {"question": "Three?", "answer": "3"},
    ]
    jsonl = write_jsonl(tmp_path / "probs.jsonl", rows)
    parquet = tmp_path / "probs.parquet"
    table = pyarrow.table(
        {
            "id": ["a", None, None, None],
            "question": ["1+1?", "Half of one?", "Two squared?", "Three?"],
            "answer": ["2", "0.5", "4", "3"],
        }
    )
    pyarrow.parquet.write_table(table, parquet)

    for path in (jsonl, parquet):
        task = MathTask(path, eval_size=1)
        train = [task.train_problem(i) for i in range(task.num_train())]
        assert train == [
            Problem("a", "1+1?", "2"),
            Problem("probs-1", "Half of one?", "0.5"),
            Problem("probs-2", "Two squared?", "4"),
        ]
        assert task.eval_problems() == [Problem("probs-3", "Three?", "3")]


def test_blank_jsonl_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"question": "q0", "answer": "0"}\n\n   \n{"question": "q1", "answer": "1"}\n')
    task = MathTask(path, eval_size=0)
    assert [task.train_problem(i).question for i in range(task.num_train())] == ["q0", "q1"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"question": "q", "answer": "1"}\n{"question": "q2", "answer": }\n',
            r"p\.jsonl:line 2: not valid JSON",
        ),
        ('{"question": "q", "answer": "1"}\n["a list"]\n', r"line 2: expected a JSON object"),
        (
            '{"question": "q"}\n',
            r"line 1: missing required field 'answer' \(fields found: 'question'\)",
        ),
        (
            '{"answer": "1"}\n',
            r"line 1: missing required field 'question' or 'problem' or 'prompt'",
        ),
        (
            '{"question": ["q"], "answer": "1"}\n',
            r"line 1: field 'question' must be a string, got a list",
        ),
        (
            '{"question": "q", "answer": true}\n',
            r"line 1: field 'answer' must be a string or an integer or a number, got bool",
        ),
        ('{"question": "  ", "answer": "1"}\n', r"line 1: field 'question' is empty"),
        (
            '{"question": "q", "answer": "1", "id": 1.5}\n',
            r"line 1: field 'id' must be a string or an integer",
        ),
        ("\n\n", r"holds no problems"),
    ],
)
def test_jsonl_errors_name_file_line_and_problem(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ProblemFileError, match=message):
        MathTask(path, eval_size=0)


def test_non_utf8_line_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "1"}\n{"question": "\xff", "answer": "1"}\n')
    with pytest.raises(ProblemFileError, match=r"line 2: not UTF-8"):
        MathTask(path, eval_size=0)


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pyarrow.parquet.write_table(
        pyarrow.table({"question": ["q0", "q1"], "answer": ["1", None]}), path
    )
    with pytest.raises(
        ProblemFileError, match=r"p\.parquet:row 2: missing required field 'answer'"
    ):
        MathTask(path, eval_size=0)
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ProblemFileError, match=r"p\.parquet: not a readable Parquet file"):
        MathTask(path, eval_size=0)


def test_missing_file_and_wrong_extension(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"problem file not found: .*nope\.jsonl"):
        MathTask(tmp_path / "nope.jsonl")
    csv = tmp_path / "p.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(
        ProblemFileError, match=r"unsupported file type '\.csv'.*\.jsonl or \.parquet"
    ):
        MathTask(csv)


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    rows = [{"id": 7, "question": "a", "answer": "1"}, {"id": "7", "question": "b", "answer": "2"}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ProblemFileError, match=r"problem id '7' is used twice"):
        MathTask(path, eval_size=0)


# ---------------------------------------------------------------------------- eval split


def test_default_eval_split_is_the_tail_tenth(tmp_path: Path) -> None:
    task = MathTask(write_jsonl(tmp_path / "p.jsonl", math_rows(30)))
    assert [p.problem_id for p in task.eval_problems()] == ["p-27", "p-28", "p-29"]
    assert task.num_train() == 27
    assert (
        MathTask(write_jsonl(tmp_path / "q.jsonl", math_rows(3))).num_train() == 2
    )  # at least one held out


def test_eval_split_never_overlaps_train(tmp_path: Path) -> None:
    rows = math_rows(20)
    rows.insert(3, dict(rows[-1], id="dup-of-tail"))  # same question as a held-out problem
    task = MathTask(write_jsonl(tmp_path / "p.jsonl", rows), eval_size=4)
    train = [task.train_problem(i) for i in range(task.num_train())]
    held_out = task.eval_problems()
    assert len(held_out) == 4
    assert {p.question for p in train}.isdisjoint(p.question for p in held_out)
    assert {p.problem_id for p in train}.isdisjoint(p.problem_id for p in held_out)
    assert task.num_train() == 21 - 4 - 1
    with pytest.raises(IndexError):
        task.train_problem(task.num_train())


def test_eval_file_is_the_whole_eval_split_and_is_removed_from_train(tmp_path: Path) -> None:
    train_path = write_jsonl(tmp_path / "train.jsonl", math_rows(10))
    eval_path = write_jsonl(tmp_path / "eval.jsonl", math_rows(12)[8:])  # overlaps train rows 8, 9
    task = MathTask(train_path, eval_path=eval_path)
    assert [p.question for p in task.eval_problems()] == [
        f"What is {i} + {i}?" for i in range(8, 12)
    ]
    train = [task.train_problem(i).question for i in range(task.num_train())]
    assert train == [f"What is {i} + {i}?" for i in range(8)]
    with pytest.raises(ProblemFileError, match=r"either eval_path .* or eval_size"):
        MathTask(train_path, eval_path=eval_path, eval_size=2)


def test_eval_size_must_leave_training_problems(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", math_rows(3))
    with pytest.raises(ProblemFileError, match=r"cannot hold out 3 of its 3 problems"):
        MathTask(path, eval_size=3)


# ----------------------------------------------------------------------------- math


@pytest.fixture(scope="module")
def math_examples() -> MathTask:
    return MathTask(EXAMPLES / "math_problems.jsonl")


def test_math_prompt_states_target_length_and_box_instruction(math_examples: MathTask) -> None:
    problem = Problem("p", "What is 2+2?", "4")
    assert math_examples.render_prompt(problem, 2000) == (
        "Think for 2000 tokens before giving a response.\nWhat is 2+2?\nPut your final answer within \\boxed{}."
    )
    assert (
        math_examples.render_prompt(problem, None)
        == "What is 2+2?\nPut your final answer within \\boxed{}."
    )


@pytest.mark.parametrize(
    ("answer", "completion", "reward"),
    [
        ("0.5", "so the answer is \\boxed{\\frac{1}{2}}", 1.0),
        ("\\frac{1}{2}", "\\boxed{0.5}", 1.0),
        ("\\frac{1}{2}", "\\boxed{1/2}", 1.0),
        ("5\\sqrt{2}", "\\boxed{\\sqrt{50}}", 1.0),
        ("3", "\\boxed{x = 3}", 1.0),
        ("\\boxed{12}", "\\boxed{12}", 1.0),
        ("\\frac{3}{4}", "first \\boxed{\\frac{3}{4}}, no wait: \\boxed{\\frac{4}{3}}", 0.0),
        ("\\frac{4}{3}", "first \\boxed{\\frac{3}{4}}, no wait: \\boxed{\\frac{4}{3}}", 1.0),
        ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}", 1.0),
        ("42", "the answer is 42", 0.0),
        ("42", "\\boxed{}", 0.0),
        ("42", "\\boxed{42", 0.0),
        ("42", "\\boxed{41}", 0.0),
        ("42", "\\boxed{" + "4" * 2000 + "}", 0.0),
    ],
)
def test_math_score(math_examples: MathTask, answer: str, completion: str, reward: float) -> None:
    assert math_examples.score(Problem("p", "q", answer), completion) == reward


def test_every_math_example_accepts_its_own_answer(math_examples: MathTask) -> None:
    task = math_examples
    problems = [task.train_problem(i) for i in range(task.num_train())] + task.eval_problems()
    assert len(problems) >= 20
    for problem in problems:
        assert math_examples.score(problem, f"\\boxed{{{problem.answer}}}") == 1.0, problem
        assert math_examples.score(problem, "\\boxed{987654}") == 0.0, problem


def test_last_boxed_handles_nesting_and_escaped_braces() -> None:
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b^{2}}}") == "\\frac{a}{b^{2}}"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("\\boxed{7} and a cut-off \\boxed{\\frac{1}{") == "7"
    assert last_boxed("no box here") is None


_balanced = st.recursive(
    st.text(alphabet=st.characters(blacklist_characters="{}\\"), max_size=8),
    lambda inner: st.builds(lambda a, b: a + "{" + b + "}", inner, inner),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(alphabet=st.characters(blacklist_characters="\\"), max_size=20),
    content=_balanced,
    suffix=st.text(alphabet=st.characters(blacklist_characters="\\{"), max_size=20),
)
def test_last_boxed_returns_any_balanced_content(prefix: str, content: str, suffix: str) -> None:
    assert last_boxed(prefix + "\\boxed{" + content + "}" + suffix) == content


def test_math_score_is_correct_from_worker_threads(math_examples: MathTask) -> None:
    problem = Problem("p", "q", "\\frac{1}{2}")
    completions = ["\\boxed{0.5}", "\\boxed{0.6}"] * 8
    with ThreadPoolExecutor(max_workers=4) as pool:
        rewards = list(pool.map(lambda c: math_examples.score(problem, c), completions))
    assert rewards == [1.0, 0.0] * 8


def test_math_pathological_answer_times_out_to_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = MathTask(
        write_jsonl(tmp_path / "p.jsonl", math_rows(2)), eval_size=0, verify_timeout_s=1
    )
    hopeless = "\\boxed{9^{9^{9^{9}}}}"
    assert task.score(Problem("p", "q", "10"), hopeless) == 0.0  # math-verify's own timeout
    # The hard deadline, hit off the main thread: the helper is killed mid-comparison
    # and replaced by a fresh one.
    monkeypatch.setattr(math_task, "_DEADLINE_SLACK_S", 0.5 - math_task._OPERATIONS * 1)
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(task.score, Problem("p", "q", "10"), hopeless).result() == 0.0
    monkeypatch.undo()
    assert task.score(Problem("p", "q", "10"), "\\boxed{10}") == 1.0


# ----------------------------------------------------------------------------- code


def run(solution: str, tests: str = "assert True", time_limit_s: float = 5.0) -> SandboxResult:
    return run_solution(solution, tests, time_limit_s=time_limit_s, memory_limit_mb=256)


def test_code_prompt_and_solution_extraction() -> None:
    task = CodeTask(EXAMPLES / "code_problems.jsonl")
    problem = task.train_problem(0)
    prompt = task.render_prompt(problem, 512)
    assert prompt.startswith(
        "Think for 512 tokens before giving a response.\n" + problem.question + "\n"
    )
    assert "```python" in prompt
    assert extract_solution("x\n```python\na = 1\n```\nthen\n```py\nb = 2\n```\n") == "b = 2\n"
    assert extract_solution("def f():\n    return 1\n") == "def f():\n    return 1\n"


def test_code_tests_given_as_a_list_are_joined(tmp_path: Path) -> None:
    rows = [{"prompt": "add", "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    task = CodeTask(path, eval_size=0)
    problem = task.train_problem(0)
    assert problem.answer == "assert add(1, 2) == 3\nassert add(0, 0) == 0"
    assert task.score(problem, "```python\ndef add(a, b):\n    return a + b\n```") == 1.0
    assert task.score(problem, "```python\ndef add(a, b):\n    return a * b\n```") == 0.0


@pytest.mark.parametrize(
    ("solution", "tests", "passes"),
    [
        ("def add(a, b):\n    return a + b", "assert add(2, 3) == 5", True),
        ("def add(a, b):\n    return a - b", "assert add(2, 3) == 5", False),
        ("def add(a, b) return a + b", "assert add(2, 3) == 5", False),
        ("def add(a, b):\n    return a + b", "assert add(2, 3) == 5 +", False),
        ("import sys\nsys.exit(0)", "assert False", False),
        ("import os\nos._exit(0)", "assert False", False),
        ("raise SystemExit", "assert False", False),
        ("print('all tests passed')\nimport os\nos._exit(0)", "assert False", False),
        (
            "def f():\n    return 1\nif __name__ == '__main__':\n    print(f(int(input())))",
            "assert f() == 1",
            True,
        ),
        (
            "import os\nassert not os.listdir('.'), 'the job file (tests, token) is readable'",
            "assert True",
            True,
        ),
    ],
)
def test_code_verdicts(solution: str, tests: str, passes: bool) -> None:
    result = run(solution, tests)
    assert result.passed is passes, result.output


def test_infinite_loop_is_killed_at_the_wall_clock_limit() -> None:
    result = run("while True:\n    pass", time_limit_s=1.0)
    assert not result.passed and result.timed_out and result.exit_code == -9


def test_huge_allocation_fails_fast() -> None:
    result = run("block = bytearray(8 * 1024 ** 3)")
    assert not result.passed and not result.timed_out and "MemoryError" in result.output


def test_huge_file_is_cut_off(tmp_path: Path) -> None:
    result = run("with open('big.bin', 'wb') as f:\n    f.write(b'x' * 200_000_000)")
    assert not result.passed and "File too large" in result.output


def test_huge_output_is_capped() -> None:
    result = run(
        "import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 10_000)\nprint('END')"
    )
    assert result.passed and len(result.output) <= 64 * 1024 and result.output.endswith("END\n")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_forked_processes_never_outlive_the_run(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    solution = (
        "import os, time\n"
        "for _ in range(20):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        f"        open({str(pid_file)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "        while True:\n"
        "            time.sleep(1)\n"
    )
    result = run(solution, time_limit_s=1.0)
    started = [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []
    # As a non-root user (or as `nobody`) fork itself fails; as root the children start
    # and the group kill must take them all down.
    assert started or "Resource temporarily unavailable" in result.output
    # SIGKILL is delivered asynchronously; give the kernel a moment to finish the kill.
    deadline = time.monotonic() + 2.0
    while [pid for pid in started if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [pid for pid in started if _alive(pid)]


def _world_readable_python() -> str | None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        return None
    path = Path(os.path.realpath(python))
    for part in [path, *path.parents]:
        if not part.stat().st_mode & stat.S_IXOTH:
            return None
    return python


@pytest.mark.skipif(
    os.geteuid() != 0 or _world_readable_python() is None,
    reason="needs root and a Python 'nobody' can run",
)
def test_as_root_solutions_run_as_nobody_and_cannot_fork() -> None:
    python = _world_readable_python()
    assert python is not None
    result = run_solution(
        "import os\nprint(os.getuid())\nos.fork()",
        "assert True",
        time_limit_s=5.0,
        memory_limit_mb=256,
        python_executable=python,
    )
    assert not result.passed
    assert "65534\n" in result.output and "BlockingIOError" in result.output


def test_every_code_example_has_valid_tests_and_rejects_a_wrong_solution() -> None:
    task = CodeTask(EXAMPLES / "code_problems.jsonl", time_limit_s=5.0)
    problems = [task.train_problem(i) for i in range(task.num_train())] + task.eval_problems()
    assert len(problems) >= 10
    for problem in problems:
        compile(problem.answer, problem.problem_id, "exec")
        assert task.score(problem, "```python\ndef unrelated():\n    pass\n```") == 0.0
