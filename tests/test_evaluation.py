"""`swarmrl eval`: the held-out figures `evaluate` returns, printed as one JSON object
whose keys are the ones `summary.json` and the benchmarks read."""

from __future__ import annotations

import json

import pytest

from swarmrl.assignment import stable_hash
from swarmrl.cli import build_parser, main
from swarmrl.config import config_from_args
from swarmrl.evaluation import Evaluation, _draw_seed, evaluate
from swarmrl.tasks.registry import build_task


@pytest.mark.slow
def test_eval_prints_what_evaluate_returns_and_repeats_it(warm_model_dir, capsys):
    argv = ["eval", "--model", str(warm_model_dir), "--task.eval_size", "12"]
    argv += ["--sampling.max_new_tokens", "24"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == ["accuracy", "length_error", "mean_length", "problems"]

    cfg = config_from_args(build_parser().parse_args(argv))
    result = evaluate(warm_model_dir, build_task(cfg.task), cfg)
    # Fixed per-problem seeds and targets: the same figures each time.
    assert Evaluation.model_validate(printed) == result
    assert result.problems == 12
    assert 0.0 <= result.accuracy <= 1.0
    assert result.length_error is not None and 0 < result.mean_length <= 24


def test_without_length_targets_the_length_error_is_none(warm_model_dir):
    argv = ["eval", "--model", str(warm_model_dir), "--task.eval_size", "4"]
    argv += ["--sampling.max_new_tokens", "16", "--task.target_lengths", "[]"]
    cfg = config_from_args(build_parser().parse_args(argv))
    result = evaluate(warm_model_dir, build_task(cfg.task), cfg)
    assert result.length_error is None
    assert json.loads(result.model_dump_json())["length_error"] is None


def test_the_evaluation_samples_at_eval_temperature_not_the_trainings(warm_model_dir):
    """The yardstick stays put when the recipe's sampling temperature changes."""
    base = ["eval", "--model", str(warm_model_dir), "--task.eval_size", "16"]
    base += ["--sampling.max_new_tokens", "24"]

    def run(*flags: str) -> Evaluation:
        cfg = config_from_args(build_parser().parse_args(base + list(flags)))
        return evaluate(warm_model_dir, build_task(cfg.task), cfg)

    assert config_from_args(build_parser().parse_args(base)).eval_temperature == 0.6
    at_default = run()
    assert run("--sampling.temperature", "1.7") == at_default
    assert run("--eval_temperature", "1.7") != at_default


def test_more_draws_per_problem_keep_the_first_and_add_their_own(warm_model_dir):
    """Draw 0 is the one-draw evaluation's sample; the others have seeds of their own, so
    the mean over draws is the same every time and differs from the first alone."""
    base = ["eval", "--model", str(warm_model_dir), "--task.eval_size", "16"]
    cfg = config_from_args(build_parser().parse_args([*base, "--sampling.max_new_tokens", "24"]))
    task = build_task(cfg.task)
    one = evaluate(warm_model_dir, task, cfg, temperature=1.0)
    seen: list[tuple[int, int]] = []
    three = evaluate(
        warm_model_dir, task, cfg, temperature=1.0, draws=3, progress=lambda *a: seen.append(a)
    )
    assert three == evaluate(warm_model_dir, task, cfg, temperature=1.0, draws=3)
    assert three.problems == one.problems == 16
    assert seen[-1] == (48, 48)
    # Draw 0 keeps the one-draw evaluation's seed; every other draw has its own.
    seeds = {d: [_draw_seed(f"p{i}", d) for i in range(16)] for d in range(4)}
    assert seeds[0] == [stable_hash(f"eval|p{i}") >> 1 for i in range(16)]
    assert len({s for d in seeds for s in seeds[d]}) == 64
    assert one == evaluate(warm_model_dir, task, cfg, temperature=1.0, draws=1)
    with pytest.raises(ValueError, match="draws"):
        evaluate(warm_model_dir, task, cfg, draws=0)
