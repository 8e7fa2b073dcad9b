"""The orchestrator's settings, derived once from the run's config: the derivation (pure),
the file `swarmrl run` writes and `swarmrl orchestrator --config` reads, flags over the
file, and a bad file refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.config import ConfigError, RunConfig, load_config
from swarmrl.identity import Identity
from swarmrl.orchestrator.config import (
    OrchestratorConfig,
    heartbeats,
    load_orchestrator_config,
    orchestrator_settings,
    read_orchestrator_config,
    run_settings,
    write_orchestrator_config,
)
from swarmrl.protocol import PoolClient
from swarmrl.rollouts import RolloutBounds
from swarmrl.run import orchestrator_role, prepare_pool

OWNER = Identity.generate().address


def derived(**overrides) -> OrchestratorConfig:
    return orchestrator_settings(load_config(overrides=overrides), owner=OWNER)


def test_the_run_sets_the_recipe_under_the_orchestrators_names():
    s = derived(
        run_name="r7",
        **{
            "trainer.steps": 9,
            "trainer.batch_samples": 32,
            "worker.prompts_per_file": 3,
            "sampling.group_size": 5,
        },
        async_level=1,
    )
    assert (s.run_id, s.steps, s.batch_samples, s.async_level) == ("r7", 9, 32, 1)
    assert (s.prompts_per_assignment, s.group_size) == (3, 5)
    assert derived(**{"trainer.steps": 0}).steps is None  # the run's 0: no last step


def test_the_run_sets_how_samples_are_drawn_and_scored():
    s = derived(
        **{
            "sampling.temperature": 0.6,
            "sampling.top_p": 0.9,
            "sampling.max_new_tokens": 64,
            "task.target_lengths": [12, 20, 28],
            "task.length_alpha": 0.05,
            "task.length_alpha_start": 0.0,
            "task.length_alpha_steps": 10,
            "task.length_shaping": "subtract",
            "task.advantage_mode": "decoupled",
        }
    )
    assert (s.temperature, s.top_p, s.max_new_tokens, s.task) == (0.6, 0.9, 64, "arithmetic")
    assert (s.target_lengths, s.length_alpha, s.length_alpha_start, s.length_alpha_steps) == (
        "12,20,28",
        0.05,
        0.0,
        10,
    )
    assert (s.length_shaping, s.advantage_mode) == ("subtract", "decoupled")
    # A task without a target length states an empty list.
    assert derived(**{"task.target_lengths": []}).target_lengths == ""
    with pytest.raises(ValueError, match="target_lengths"):
        OrchestratorConfig(target_lengths="32;41")


def test_a_changed_heartbeat_changes_the_orchestrators_and_its_counts():
    s = derived(**{"pool.heartbeat_seconds": 5.0, "pool.dead_seconds": 60.0})
    assert s.heartbeat_seconds == 5.0
    assert (s.unhealthy_after, s.dead_after) == (6, 12)


@pytest.mark.parametrize(
    ("heartbeat", "dead", "unhealthy_after", "dead_after"),
    [
        (3.0, 10.0, 2, 4),  # 5/3 and 10/3 rounded up: never declared dead early
        (2.0, 60.0, 15, 30),
        (2.0, 1.0, 1, 1),  # at least one heartbeat
    ],
)
def test_dead_seconds_round_up_to_whole_heartbeats(heartbeat, dead, unhealthy_after, dead_after):
    s = derived(**{"pool.heartbeat_seconds": heartbeat, "pool.dead_seconds": dead})
    assert (s.unhealthy_after, s.dead_after) == (unhealthy_after, dead_after)
    assert s.dead_after * s.heartbeat_seconds >= dead
    assert heartbeats(dead, heartbeat) == dead_after


def test_validation_assignments_stake_and_file_bounds_follow_the_run():
    cfg = load_config(
        overrides={
            "validator.fraction": 0.25,
            "pool.assignment_seconds": 33.0,
            "pool.surplus": 0.3,
            "pool.stake": 4.0,
            "sampling.max_new_tokens": 100,
            "trainer.max_read_ratio": 2.5,
        }
    )
    s = orchestrator_settings(cfg, owner=OWNER)
    assert (s.validation_fraction, s.assignment_seconds, s.surplus) == (0.25, 33.0, 0.3)
    assert s.max_read_ratio == 2.5  # the step's work stops where the trainer's reading does
    assert (s.min_stake, s.owner) == (4.0, OWNER)
    bounds = RolloutBounds.for_run(cfg)
    assert (s.max_new_tokens, s.max_prompt_tokens) == (
        bounds.max_new_tokens,
        bounds.max_prompt_tokens,
    )


def test_what_the_deployment_gives_wins_over_what_is_derived(tmp_path):
    s = orchestrator_settings(
        RunConfig(), owner=OWNER, ledger=f"sqlite:///{tmp_path}/l.db", heartbeat_seconds=7.0
    )
    assert (s.ledger, s.heartbeat_seconds) == (f"sqlite:///{tmp_path}/l.db", 7.0)


def test_a_stake_without_an_owner_is_refused():
    with pytest.raises(ValueError, match="needs an owner"):
        orchestrator_settings(RunConfig())
    assert orchestrator_settings(load_config(overrides={"pool.stake": 0})).min_stake == 0


def test_a_bare_orchestrator_and_a_default_run_agree():
    """One set of defaults: every setting the run's config holds has the run's default,
    but for the three a bare orchestrator cannot know (which run, its last step, and the
    stake, which needs an owner to fund it)."""
    bare = OrchestratorConfig().model_dump()
    differ = {k for k, v in run_settings(RunConfig()).items() if bare[k] != v}
    assert differ == {"run_id", "steps", "min_stake"}


PRINTABLE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(run_id=PRINTABLE, store=PRINTABLE, heartbeat=st.floats(1e-6, 1e9), burst=st.integers(1))
def test_the_written_file_reads_back_the_same_settings(
    tmp_path_factory, run_id, store, heartbeat, burst
):
    config = OrchestratorConfig(
        run_id=run_id, store=store, heartbeat_seconds=heartbeat, rate_burst=burst, speculate=False
    )
    path = tmp_path_factory.mktemp("w") / "config.toml"
    write_orchestrator_config(config, path)
    tomllib.loads(path.read_text())  # valid TOML
    assert load_orchestrator_config(read_orchestrator_config(path), {}, str(path)) == config


def test_a_bad_value_or_key_names_the_field_and_where_it_came_from(tmp_path):
    path = tmp_path / "o.toml"
    path.write_text('heartbeat_seconds = "soon"\n')
    with pytest.raises(ConfigError, match=r"o.toml: heartbeat_seconds: .*number.*\"soon\""):
        load_orchestrator_config(read_orchestrator_config(path), {}, str(path))
    path.write_text("heartbeat = 2\n")
    with pytest.raises(ConfigError, match=r"o.toml: heartbeat: Extra inputs"):
        load_orchestrator_config(read_orchestrator_config(path), {}, str(path))
    with pytest.raises(ConfigError, match=r"--group-size: .*greater than or equal to 2"):
        load_orchestrator_config({}, {"group_size": "1"}, str(path))


def test_swarmrl_run_starts_the_orchestrator_on_the_derived_file(tmp_path):
    cfg = load_config(
        overrides={"output_dir": str(tmp_path), "run_name": "f", "pool.heartbeat_seconds": 0.5}
    )
    prepare_pool(cfg)
    role = orchestrator_role(cfg, 8123)
    folder = cfg.folder
    assert role.args == [
        "orchestrator",
        "--config",
        str(folder.orchestrator_config.resolve()),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
    ]
    written = load_orchestrator_config(
        read_orchestrator_config(folder.orchestrator_config), {}, "file"
    )
    assert written.heartbeat_seconds == 0.5
    assert written.allowlist == str(folder.allowlist.resolve())
    assert written.owner is not None and written.min_stake == cfg.pool.stake


def orchestrator(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swarmrl.orchestrator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_the_orchestrator_serves_the_file_with_flags_over_it(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text(
        'run_name = "from-file"\n[sampling]\ngroup_size = 4\n'
        "[pool]\nstake = 0\nheartbeat_seconds = 0.7\n"
    )
    settings_file = tmp_path / "orchestrator.toml"
    wrote = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmrl.orchestrator",
            "--run-config",
            str(run),
            "--ledger",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--store",
            str(tmp_path / "store"),
            "--secret-file",
            str(tmp_path / "secret"),
            "--write-config",
            str(settings_file),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrote.returncode == 0, wrote.stderr
    proc = orchestrator("--config", str(settings_file), "--port", "0", "--async-level", "1")
    try:
        line = proc.stdout.readline()
        assert line.startswith("orchestrator listening on "), line + proc.stderr.read()
        url = line.split()[-1]
        with PoolClient(url, Identity.generate()) as member:
            recipe = member.recipe()
            assert (recipe.run_id, recipe.group_size) == ("from-file", 4)  # from the file
            assert recipe.async_level == 1  # the flag over the file's 2
            member.register("worker")
            assert member.heartbeat().heartbeat_seconds == 0.7
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_bad_settings_file_stops_with_one_line_and_exit_2(tmp_path):
    path = tmp_path / "orchestrator.toml"
    path.write_text("dead_after = 0\n")
    proc = orchestrator("--config", str(path), "--port", "0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out + err
    assert err.strip().splitlines() == [
        f"swarmrl orchestrator: invalid config: {path}: dead_after: "
        "Input should be greater than or equal to 1 (got 0)"
    ]
