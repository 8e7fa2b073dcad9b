"""The offline difficulty filter: band arithmetic, the held-out split, the written
prompt set read back by its task, and `swarmrl filter` end to end on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmrl.cli import main
from swarmrl.tasks.arithmetic import ArithmeticTask
from swarmrl.tasks.base import Problem
from swarmrl.tasks.filtering import (
    PassRate,
    check_band,
    choose_prompts,
    count_passes,
    in_band,
    keep_band,
    kept_pass_counts,
    pass_histogram,
    pass_rate_row,
    problem_row,
    write_problem_file,
)
from swarmrl.tasks.loading import ProblemFileError
from swarmrl.tasks.math import MathTask

MATH_EXAMPLES = Path(__file__).parents[1] / "examples" / "math_problems.jsonl"


def _result(passes: int, samples: int = 8, index: int = 0) -> PassRate:
    problem = Problem(problem_id=f"p{index}", question=f"q{index}", answer="1")
    return PassRate(index=index, problem=problem, passes=passes, samples=samples)


def test_band_keeps_the_hand_computed_pass_counts():
    # The paper's band over 8 samples: 1/8 = 0.125 ... 6/8 = 0.75 lie in [0.1, 0.8];
    # 0 and 7/8 = 0.875 and 8/8 do not.
    assert kept_pass_counts(8, 0.1, 0.8) == [1, 2, 3, 4, 5, 6]
    # Both ends are included: 1/5 = 0.2 and 4/5 = 0.8.
    assert kept_pass_counts(5, 0.2, 0.8) == [1, 2, 3, 4]
    assert kept_pass_counts(4, 0.0, 1.0) == [0, 1, 2, 3, 4]
    assert kept_pass_counts(4, 0.3, 0.4) == []
    assert kept_pass_counts(16, 0.5, 0.5) == [8]
    # A band end typed as a rounded decimal still keeps k/K: 2/3 = 0.6666666666666...
    assert kept_pass_counts(3, 0.3333333333, 0.6666666666) == [1, 2]
    assert in_band(3, 8, 0.1, 0.8) and not in_band(7, 8, 0.1, 0.8) and not in_band(0, 8, 0.1, 0.8)
    with pytest.raises(ValueError, match="not a pass rate"):
        in_band(9, 8, 0.1, 0.8)


def test_band_out_of_range_is_refused():
    for low, high in [(-0.1, 0.5), (0.2, 1.5), (0.8, 0.1)]:
        with pytest.raises(ValueError, match="--band"):
            check_band(low, high)


def test_pass_counts_histogram_and_kept_prompts():
    assert count_passes([1.0, 0.0, 1.0, 0.0, 0.0]) == 2
    results = [_result(p, index=i) for i, p in enumerate([0, 8, 1, 6, 7, 3, 0])]
    assert pass_histogram(results, 8) == [2, 1, 0, 1, 0, 0, 1, 1, 1]
    kept = keep_band(results, 0.1, 0.8)
    assert [r.index for r in kept] == [2, 3, 5]
    assert [r.rate for r in kept] == [0.125, 0.75, 0.375]


def test_prompt_choice_is_seeded_sorted_and_within_range():
    assert choose_prompts(5, None, 0) == [0, 1, 2, 3, 4]
    assert choose_prompts(5, 9, 0) == [0, 1, 2, 3, 4]
    picked = choose_prompts(1000, 20, 3)
    assert picked == sorted(set(picked)) and len(picked) == 20 and picked[-1] < 1000
    assert picked == choose_prompts(1000, 20, 3) and picked != choose_prompts(1000, 20, 4)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_arithmetic_task_reads_the_written_set_and_keeps_its_held_out_split(tmp_path, suffix):
    plain = ArithmeticTask()
    chosen = [plain.train_problem(i) for i in (5, 70_000, 123_456)]
    held = plain.eval_problems()
    rows = [pass_rate_row(plain, PassRate(0, p, 3, 8)) for p in chosen]
    # A held-out pair written into the file (by hand: the filter never samples one)
    # is dropped from training, and the held-out split stays what it was.
    rows.insert(1, problem_row(plain, held[0]) | {"pass_rate": 0.5})
    path = tmp_path / f"filtered{suffix}"
    write_problem_file(path, rows)
    task = ArithmeticTask(path=path)
    assert task.num_train() == 3
    assert [task.train_problem(i) for i in range(3)] == chosen
    assert task.eval_problems() == held
    with pytest.raises(IndexError):
        task.train_problem(3)


def test_arithmetic_problem_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 12, "b": 345}\n')
    with pytest.raises(ProblemFileError, match="three-digit"):
        ArithmeticTask(path=bad)
    bad.write_text('{"a": 123, "b": 345}\n{"a": 123, "b": 345}\n')
    with pytest.raises(ProblemFileError, match="appears twice"):
        ArithmeticTask(path=bad)
    bad.write_text('{"a": 123}\n')
    with pytest.raises(ProblemFileError, match="missing required field 'b'"):
        ArithmeticTask(path=bad)


def _filter(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = main(["filter", *args])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


@pytest.mark.slow
def test_filter_command_end_to_end_on_the_tiny_model(tmp_path, capsys, warm_model_dir):
    out = tmp_path / "filtered.jsonl"
    code, summary, err = _filter(
        capsys,
        *("--model", str(warm_model_dir), "--limit", "24", "--samples", "4"),
        *("--band", "0", "1", "--out", str(out)),
    )
    assert code == 0, err
    assert summary is not None
    assert summary["prompts"] == 24 and summary["samples_generated"] == 96
    assert sum(summary["prompts_by_passes"]) == 24 and summary["kept"] == 24
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 24
    assert all(row["samples"] == 4 and row["pass_rate"] == row["passes"] / 4 for row in rows)
    held_ids = {p.problem_id for p in ArithmeticTask().eval_problems()}
    assert not held_ids & {row["id"] for row in rows}
    # The run's task reads it back (what `--task.path FILE` gives every role).
    task = ArithmeticTask(path=out)
    assert [task.train_problem(i).problem_id for i in range(task.num_train())] == [
        row["id"] for row in rows
    ]
    assert summary["train_with"] == f"--task.name arithmetic --task.path {out}"

    # The same seed gives the same pass rates, and a band keeps exactly its rows: here
    # the band of the most common pass count k, [k/4, k/4].
    k = max(range(5), key=summary["prompts_by_passes"].__getitem__)
    narrow = tmp_path / "narrow.parquet"
    code, again, err = _filter(
        capsys,
        *("--model", str(warm_model_dir), "--limit", "24", "--samples", "4"),
        *("--band", str(k / 4), str(k / 4), "--out", str(narrow)),
    )
    assert code == 0, err
    assert again is not None and again["prompts_by_passes"] == summary["prompts_by_passes"]
    kept = ArithmeticTask(path=narrow)
    assert [kept.train_problem(i).problem_id for i in range(kept.num_train())] == [
        row["id"] for row in rows if row["passes"] == k
    ]


@pytest.mark.slow
def test_filter_on_a_file_task_copies_the_held_out_split_and_refuses_an_empty_result(
    tmp_path, capsys, warm_model_dir
):
    out = tmp_path / "math.jsonl"
    common = ("--model", str(warm_model_dir), "--task.name", "math", "--samples", "2")
    common += ("--task.path", str(MATH_EXAMPLES), "--task.eval_size", "2")
    # The arithmetic model never writes a \boxed{} answer: every pass rate is 0.
    code, _, err = _filter(capsys, *common, "--out", str(out))
    assert code == 1 and "no prompt's pass rate lies in [0.1, 0.8]" in err and not out.exists()

    code, summary, err = _filter(capsys, *common, "--band", "0", "1", "--out", str(out))
    assert code == 0, err
    assert summary is not None
    original = MathTask(MATH_EXAMPLES)
    held_file = tmp_path / "math.heldout.jsonl"
    assert summary["held_out_file"] == str(held_file)
    task = MathTask(out, eval_path=held_file)
    assert task.eval_problems() == original.eval_problems()
    assert [task.train_problem(i) for i in range(task.num_train())] == [
        original.train_problem(i) for i in range(original.num_train())
    ]
    held_questions = {p.question for p in original.eval_problems()}
    assert not held_questions & {json.loads(line)["question"] for line in out.open()}


def test_filter_refuses_bad_input(tmp_path, capsys, warm_model_dir):
    out = str(tmp_path / "f.jsonl")
    code, _, err = _filter(capsys, "--model", str(tmp_path / "nope"), "--limit", "2", "--out", out)
    assert code == 2 and "--model" in err and "not a Hugging Face model directory" in err
    code, _, err = _filter(capsys, "--band", "0.5", "1.5", "--limit", "2", "--out", out)
    assert code == 2 and "both ends must lie in [0, 1]" in err
    code, _, err = _filter(capsys, "--model", str(warm_model_dir), "--out", out)
    assert code == 2 and "give --limit N" in err
    code, _, err = _filter(capsys, "--limit", "2", "--out", str(tmp_path / "f.csv"))
    assert code == 2 and ".jsonl or .parquet" in err
    math_task = ("--task.name", "math", "--task.path", str(MATH_EXAMPLES))
    code, _, err = _filter(capsys, *math_task, "--out", str(MATH_EXAMPLES))
    assert code == 2 and "one of the task's own problem files" in err
    assert not Path(out).exists()
