"""Configuration: TOML + flags, and one-line errors naming the field."""

import math
import subprocess
import sys

import pytest

from swarmrl.cli import build_parser
from swarmrl.config import ConfigError, config_from_args, load_config


def test_defaults_toml_and_flags(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('run_name = "x"\nasync_level = 1\n[trainer]\nlr = 0.01\nsteps = 3\n')
    args = build_parser().parse_args(
        ["run", "--config", str(toml), "--trainer.steps", "5", "--task.target_lengths", "[10, 20]"]
    )
    cfg = config_from_args(args)
    assert cfg.run_name == "x" and cfg.async_level == 1
    assert cfg.trainer.lr == 0.01 and cfg.trainer.steps == 5
    assert cfg.task.target_lengths == [10, 20]
    assert load_config().sampling.temperature == 1.0


@pytest.mark.parametrize(
    "flag,value,field",
    [
        ("--trainer.lr", "-1", "trainer.lr"),
        ("--async_level", "-2", "async_level"),
        ("--task.name", "chess", "task.name"),
        ("--sampling.group_size", "one", "sampling.group_size"),
    ],
)
def test_bad_value_names_the_field(flag, value, field):
    args = build_parser().parse_args(["run", flag, value])
    with pytest.raises(ConfigError) as err:
        config_from_args(args)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"invalid config: {field}:")


def test_unknown_toml_key_is_an_error(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[trainer]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match=r"trainer\.learning_rate"):
        load_config(toml)


@pytest.mark.slow
def test_cli_exits_at_start_with_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmrl",
            "run",
            "--trainer.lr",
            "-1",
            "--output_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["swarmrl: invalid config: trainer.lr: Input should be greater than 0 (got -1)"]
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_help_documents_every_field():
    text = (
        build_parser()
        .parse_args.__self__._subparsers._group_actions[0]
        .choices["run"]
        .format_help()
    )
    for flag in (
        "--trainer.lr",
        "--async_level",
        "--task.target_lengths",
        "--sampling.temperature",
        "--worker.count",
    ):
        assert flag in text
    assert "AdamW learning rate" in text


def test_user_task_files_build_from_config(tmp_path):
    """The math and code tasks load the user's files through the config, with a held-out
    tail or a separate eval file."""
    from pathlib import Path

    from swarmrl.tasks.registry import build_task

    examples = Path(__file__).resolve().parents[1] / "examples"
    math = build_task(load_config(examples / "math.toml").task)
    assert len(math.eval_problems()) == 4 and math.num_train() >= 10
    eval_file = tmp_path / "held.jsonl"
    eval_file.write_text(
        '{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n'
    )
    cfg = load_config(
        overrides={
            "task.name": "math",
            "task.path": str(examples / "math_problems.jsonl"),
            "task.eval_path": str(eval_file),
        }
    )
    task = build_task(cfg.task)
    assert [p.answer for p in task.eval_problems()] == ["2", "4"]
    code = build_task(load_config(examples / "code.toml").task)
    assert len(code.eval_problems()) == 2


def test_length_alpha_sets_the_rewards_coefficient(tmp_path):
    from swarmrl.rewards import score_sample

    toml = tmp_path / "c.toml"
    toml.write_text("[task]\nlength_alpha = 0.05\n")
    cfg = load_config(toml)
    assert cfg.task.length_alpha == 0.05
    reward = score_sample(1.0, 40, 32, cfg.task.length_alpha, cfg.task.length_shaping)
    assert reward.total == pytest.approx(math.exp(-0.4))  # task reward × e^(−α·|Δ|)
    assert reward.length_penalty == pytest.approx(1 - math.exp(-0.4))
    assert load_config().task.length_alpha == 0.2  # the embedded default


@pytest.mark.parametrize("source", ["toml", "flag"])
def test_old_length_penalty_key_still_works_with_a_deprecation_message(tmp_path, caplog, source):
    toml = tmp_path / "old.toml"
    toml.write_text("[task]\nlength_penalty = 0.06\n")
    argv = ["run", "--config", str(toml)] if source == "toml" else ["run"]
    if source == "flag":
        argv += ["--task.length_penalty", "0.06"]
    with caplog.at_level("WARNING", logger="swarmrl.config"):
        cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.task.length_alpha == 0.06
    assert "length_penalty" not in cfg.task.model_dump()
    assert any(
        "task.length_penalty is deprecated" in r.message and "task.length_alpha" in r.message
        for r in caplog.records
    )


def test_old_and_new_length_key_together_is_an_error():
    args = build_parser().parse_args(
        ["run", "--task.length_alpha", "0.01", "--task.length_penalty", "0.02"]
    )
    with pytest.raises(ConfigError, match=r"task.length_penalty .* task.length_alpha"):
        config_from_args(args)


def test_examples_use_length_alpha():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    for toml in sorted(examples.glob("*.toml")):
        assert "length_penalty" not in toml.read_text(), toml.name
        assert load_config(toml).task.length_alpha > 0, toml.name
