"""Running a pool across machines, as an operator meets it: real orchestrator, worker and
relay processes, and the commands an operator types. The pool states its recipe and
refuses members that disagree; relays may not announce unroutable URLs; the status counts
trained files; the ledger check has a command; a first start in an empty folder works;
and the commands print no noise a user would wonder about."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from pool_fixtures import make_pool, orchestrator_process, rollout_file
from swarmrl.commands.status import render
from swarmrl.identity import Identity, generate_key_file
from swarmrl.protocol import PoolRefused
from swarmrl.protocol import models as api
from swarmrl.shardcast.relay import Relay

SWARMRL = [sys.executable, "-m", "swarmrl"]


def swarmrl(*args: str, timeout: float = 120, cwd: Path | None = None):
    return subprocess.run(
        [*SWARMRL, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def wait_for_member(url: str, role: str, timeout: float = 120) -> api.Member:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = api.PoolStatus.model_validate_json(httpx.get(f"{url}/v1/status").content)
        members = [m for m in status.members if m.role == role]
        if members:
            return members[0]
        time.sleep(0.2)
    raise AssertionError(f"no {role} registered within {timeout} s")


# -- the recipe -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_of_another_run_is_refused_at_registration_with_both_values(tmp_path):
    proc, url = orchestrator_process(tmp_path, "--run-id", "pool-run", "--batch-samples", "64")
    try:
        served = api.Recipe.model_validate_json(httpx.get(f"{url}/v1/recipe").content)
        assert (served.run_id, served.batch_samples, served.steps) == ("pool-run", 64, None)
        generate_key_file(tmp_path / "worker.key")
        worker = swarmrl(
            "worker",
            "--orchestrator",
            url,
            "--key",
            str(tmp_path / "worker.key"),
            "--workdir",
            str(tmp_path / "w"),
            "--run_name",
            "other-run",
            "--trainer.batch_samples",
            "64",
        )
        assert worker.returncode == 1
        said = [line for line in worker.stderr.splitlines() if "recipe mismatch" in line]
        assert len(said) == 1, worker.stderr
        assert "run_id: the pool's is 'pool-run', this member's 'other-run'" in said[0]
        assert "batch_samples" not in said[0]  # only what differs
        # The operator sees the refusal and its reason without the worker's log.
        shown = swarmrl("status", "--orchestrator", url)
        assert shown.returncode == 0, shown.stderr
        assert "refused registrations" in shown.stdout
        assert "recipe mismatch" in shown.stdout and "pool-run" in shown.stdout
        assert "HTTP Request" not in shown.stderr  # httpx's line per request
    finally:
        stop(proc)


def test_a_matching_recipe_registers_and_an_unset_pool_value_is_not_checked(tmp_path):
    pool = make_pool(tmp_path, workers=0)  # run id "test", no steps
    try:
        client = pool.client(Identity.generate())
        ours = api.Recipe(run_id="test", steps=7, batch_samples=8, prompts_per_assignment=2)
        assert client.register("worker", recipe=ours).status == "healthy"
        other = Identity.generate()
        with pytest.raises(PoolRefused) as caught:
            pool.client(other).register("worker", recipe=ours.model_copy(update={"group_size": 4}))
        assert caught.value.status == 409
        assert caught.value.detail == (
            "recipe mismatch: group_size: the pool's is 2, this member's 4 "
            "(its config's sampling.group_size)"
        )
        refused = pool.trainer.status().refusals
        assert [(r.address, r.role) for r in refused] == [(other.address, "worker")]
        assert pool.ledger_problems() == []
    finally:
        pool.stop()


# -- unroutable relay URLs --------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://0.0.0.0:8802", "http://[::]:8802"])
def test_a_relay_url_no_machine_can_reach_is_refused(tmp_path, url):
    relay = Identity.generate()
    pool = make_pool(tmp_path, workers=0)
    try:
        with open(tmp_path / "allowlist", "a") as fh:
            fh.write(f"{relay.address} relay\n")
        pool.restart()  # the allowlist is read at start
        with pytest.raises(PoolRefused) as caught:
            pool.client(relay).register("relay", url=url)
        assert caught.value.status == 422 and "every interface" in caught.value.detail
        assert pool.client(relay).register("relay", url="http://relay1.example:8802")
    finally:
        pool.stop()


def test_a_relay_bound_to_every_interface_needs_a_public_url(tmp_path):
    generate_key_file(tmp_path / "relay.key")
    relay = swarmrl(
        "relay",
        "--orchestrator",
        "http://127.0.0.1:9",
        "--key",
        str(tmp_path / "relay.key"),
        "--upstream",
        "http://127.0.0.1:9",
        "--root",
        str(tmp_path / "relay"),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
    )
    assert relay.returncode == 2
    assert "--host 0.0.0.0" in relay.stderr and "--public-url" in relay.stderr
    assert not (tmp_path / "relay").exists()  # refused before anything started


def test_a_relay_started_before_its_upstream_waits_quietly(tmp_path, caplog):
    relay = Relay(["http://127.0.0.1:9"], tmp_path / "relay", timeout=0.5)
    with caplog.at_level(logging.INFO, logger="swarmrl.shardcast.relay"):
        for _ in range(3):
            assert relay.sync_once() == []
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "waiting for an upstream" in caplog.records[0].getMessage()


# -- status, the ledger check, the first start ------------------------------------------


@pytest.mark.slow
def test_status_counts_trained_files_and_the_ledger_check_has_a_command(tmp_path):
    pool = make_pool(tmp_path, workers=1, validation_fraction=0.0)
    try:
        assert pool.trainer is not None
        pool.trainer.announce_checkpoint(0, "a" * 64)
        worker = pool.workers[0]
        work = worker.assignment(0).assignment
        assert work is not None
        path = rollout_file(tmp_path / "f.parquet", worker.address, work)
        info = worker.upload(work.id, path)
        pool.trainer.mark_trained(0, [info.file_hash])
        status = pool.trainer.status()
        assert status.submissions == {"trained": 1}
        console = Console(width=200, record=True)
        render(status, console)
        assert "submissions: 1 trained" in console.export_text()
    finally:
        pool.stop()
    ledger = pool.config.ledger
    checked = swarmrl("pool", "check", "--ledger", ledger)
    assert (checked.returncode, checked.stdout.strip()) == (
        0,
        f"ledger {ledger}: consistent (1 submissions)",
    )
    with sqlite3.connect(tmp_path / "ledger.db") as db:  # a file accepted without a verdict
        db.execute("UPDATE submissions SET state = 'accepted'")
    checked = swarmrl("pool", "check", "--ledger", ledger)
    assert checked.returncode == 1
    assert f"submission {info.file_hash[:12]} is accepted without a verdict" in checked.stdout
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    checked = swarmrl("pool", "check", "--ledger", missing)
    assert checked.returncode == 2 and "does not exist" in checked.stderr
    assert not (tmp_path / "none.db").exists()
    # A ledger of another version is refused as it is, never migrated by the check.
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        db.execute("UPDATE alembic_version SET version_num = '0004'")
    checked = swarmrl("pool", "check", "--ledger", ledger)
    assert checked.returncode == 2, checked.stderr
    assert "its schema is at 0004, this swarmrl's at 0008" in checked.stderr
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("0004",)]


@pytest.mark.slow
def test_the_orchestrator_starts_in_an_empty_folder_without_torch(tmp_path):
    empty = tmp_path / "empty"
    (empty / "tmp").mkdir(parents=True)
    proc = subprocess.Popen(
        [*SWARMRL, "orchestrator", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=empty,
        env=os.environ | {"PYTHONUNBUFFERED": "1", "TMPDIR": str(empty / "tmp")},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("orchestrator listening on "), line + proc.communicate()[1]
        assert httpx.get(f"{line.split()[-1]}/v1/status").status_code == 200
        assert (empty / "orchestrator" / "ledger.db").is_file()
        assert not (empty / "tmp" / "torchinductor_root").exists()  # torch never loaded
    finally:
        stop(proc)


def test_the_pool_services_and_the_parser_load_no_model_library():
    code = (
        "import sys; from swarmrl.cli import build_parser; build_parser(); "
        "import swarmrl.orchestrator.app, swarmrl.shardcast.cli, swarmrl.commands.status; "
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"


def test_a_plain_trainer_saves_and_loads_its_state_without_distributed_warnings(tmp_path):
    import torch

    from swarmrl.trainer.distributed import Ranks
    from swarmrl.trainer.state import load_trainer_state, save_trainer_state

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_trainer_state(tmp_path / "state", model, opt, {"step": 1}, Ranks())
        assert load_trainer_state(tmp_path / "state", model, opt, Ranks()) == {"step": 1}
    assert [str(w.message) for w in caught if "single process" in str(w.message)] == []


# -- noise ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_stopped_by_sigterm_leaks_no_semaphores(tmp_path):
    proc, url = orchestrator_process(tmp_path)
    generate_key_file(tmp_path / "worker.key")
    try:
        worker = subprocess.Popen(
            [
                *SWARMRL,
                "worker",
                "--orchestrator",
                url,
                "--key",
                str(tmp_path / "worker.key"),
                "--workdir",
                str(tmp_path / "w"),
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # its own process group, as `swarmrl run` starts it
        )
        wait_for_member(url, "worker")
        time.sleep(3)  # its proof process is spawned after registration
        os.killpg(worker.pid, signal.SIGTERM)  # how a supervisor stops it: the whole group
        _, stderr = worker.communicate(timeout=60)
        assert "leaked semaphore" not in stderr, stderr
        assert "Traceback" not in stderr, stderr
    finally:
        stop(proc)


def test_each_role_states_only_the_recipe_fields_it_reads():
    from swarmrl.config import load_config
    from swarmrl.protocol import recipe

    pool = api.Recipe(
        run_id="r",
        steps=50,
        batch_samples=128,
        prompts_per_assignment=8,
        group_size=8,
        async_level=2,
    )
    # A worker or validator with another trainer.steps or batch size is not refused:
    # it never reads them.
    cfg = load_config(None, {"run_name": "r", "trainer.steps": 7, "trainer.batch_samples": 512})
    assert recipe.differences(pool, recipe.of_run(cfg, "worker")) == []
    assert recipe.differences(pool, recipe.of_run(cfg, "validator")) == []
    # A trainer that needs more than the pool issues is refused; one that needs less only
    # leaves work unused (a run resumed with more steps starts so).
    cfg = load_config(None, {"run_name": "r", "trainer.steps": 70, "trainer.batch_samples": 512})
    said = recipe.differences(pool, recipe.of_run(cfg, "trainer"))
    assert [line.split(":")[0] for line in said] == ["steps", "batch_samples"]
    small = load_config(None, {"run_name": "r", "trainer.steps": 7, "trainer.batch_samples": 64})
    assert recipe.differences(pool, recipe.of_run(small, "trainer")) == []


def test_a_member_that_samples_or_scores_otherwise_is_refused_by_name():
    # The validator replays each draw and recomputes the rewards: a worker at another
    # temperature, or with another length coefficient, would write honest files it
    # rejects. The pool refuses such a member at registration instead, naming the field.
    from swarmrl.config import load_config
    from swarmrl.orchestrator.config import orchestrator_settings
    from swarmrl.protocol import recipe

    pool = recipe.of_pool(
        orchestrator_settings(load_config(None, {"run_name": "r", "pool.stake": 0.0}))
    )
    hot = load_config(None, {"run_name": "r", "sampling.temperature": 0.6})
    assert recipe.differences(pool, recipe.of_run(hot, "worker")) == [
        "temperature: the pool's is 1.0, this member's 0.6 (its config's sampling.temperature)"
    ]
    scored = load_config(
        None,
        {
            "run_name": "r",
            "task.length_alpha": 0.1,
            "task.target_lengths": [20],
            "task.advantage_mode": "centered",
        },
    )
    said = recipe.differences(pool, recipe.of_run(scored, "validator"))
    assert [line.split(":")[0] for line in said] == [
        "target_lengths",
        "length_alpha",
        "length_alpha_start",
        "advantage_mode",
    ]
    assert "target_lengths: the pool's is '32,41', this member's '20'" in said[0]
    # The trainer never samples: its top_p is not its to state.
    nucleus = load_config(None, {"run_name": "r", "sampling.top_p": 0.9})
    assert recipe.differences(pool, recipe.of_run(nucleus, "trainer")) == []
    assert [
        x.split(":")[0] for x in recipe.differences(pool, recipe.of_run(nucleus, "worker"))
    ] == ["top_p"]


def test_length_curricula_that_score_every_step_alike_state_the_same_recipe():
    from swarmrl.config import load_config
    from swarmrl.protocol import recipe

    def stated(**task):
        cfg = load_config(None, {"run_name": "r", **{f"task.{k}": v for k, v in task.items()}})
        return recipe.of_run(cfg, "worker")

    none = stated()
    assert (none.length_alpha_start, none.length_alpha_steps) == (0.2, 0)
    # A start with no steps to move over is no curriculum, whatever its value.
    assert stated(length_alpha_start=0.05) == none
    assert stated(length_alpha_steps=9) == none
    moving = stated(length_alpha_start=0.05, length_alpha_steps=9)
    assert (moving.length_alpha_start, moving.length_alpha_steps) == (0.05, 9)
    assert recipe.differences(none, moving) == [
        "length_alpha_start: the pool's is 0.2, this member's 0.05 (its config's "
        "task.length_alpha_start)",
        "length_alpha_steps: the pool's is 0, this member's 9 (its config's "
        "task.length_alpha_steps)",
    ]
