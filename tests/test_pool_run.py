"""`swarmrl run`'s pool: keys, allowlist and a supervised orchestrator on loopback."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from swarmrl.config import load_config
from swarmrl.identity import load_identity
from swarmrl.orchestrator.membership import read_allowlist
from swarmrl.protocol import PoolClient
from swarmrl.protocol.client import PoolRefused
from swarmrl.protocol.funding import fund_workers, owner_key
from swarmrl.run import (
    free_port,
    orchestrator_role,
    pool_status,
    prepare_pool,
    wait_for_orchestrator,
)
from swarmrl.supervisor import Supervisor


def _cfg(tmp_path, **overrides):
    return load_config(
        overrides={
            "output_dir": str(tmp_path / "out"),
            "run_name": "p",
            "worker.count": 2,
            "shardcast.relays": 2,
            "supervision.backoff_seconds": 0.2,
            **overrides,
        }
    )


def test_keys_live_with_their_owners_and_are_reused_on_resume(tmp_path):
    cfg = _cfg(tmp_path)
    folder = cfg.folder
    keys = prepare_pool(cfg)
    assert set(keys) == {"trainer", "validator", "relay-0", "relay-1", "worker-0", "worker-1"}
    for name, path in keys.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        inside = path.resolve().is_relative_to(folder.root.resolve())
        # A worker's key is in its own folder, beside the run folder, never inside it.
        assert inside == (not name.startswith("worker-")), (name, path)
    addresses = {name: load_identity(path).address for name, path in keys.items()}
    assert read_allowlist(str(folder.allowlist)) == {
        addresses["trainer"]: {"trainer"},
        addresses["validator"]: {"validator"},
        addresses["relay-0"]: {"relay"},
        addresses["relay-1"]: {"relay"},
    }
    again = prepare_pool(cfg)
    assert {name: load_identity(path).address for name, path in again.items()} == addresses


def test_no_validator_key_when_nothing_is_validated(tmp_path):
    cfg = _cfg(tmp_path, **{"validator.fraction": 0})
    keys = prepare_pool(cfg)
    assert "validator" not in keys
    roles = {r for rs in read_allowlist(str(cfg.folder.allowlist)).values() for r in rs}
    assert roles == {"trainer", "relay"}


@pytest.mark.slow
def test_the_supervised_orchestrator_admits_the_run_and_keeps_its_ledger_across_a_kill(
    tmp_path,
):
    cfg = _cfg(tmp_path)
    keys = prepare_pool(cfg)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sup = Supervisor(cfg.supervision, tmp_path / "processes.json", lambda line: None)
    try:
        sup.start(orchestrator_role(cfg, port))
        wait_for_orchestrator(sup, url)
        identities = {name: load_identity(path) for name, path in keys.items()}
        # A staked pool: a worker registers once the run's owner key has funded it, and
        # funding again (a resumed run) adds nothing.
        workers = [identities["worker-0"], identities["worker-1"]]
        with PoolClient(url, identities["worker-0"]) as worker, pytest.raises(PoolRefused) as short:
            worker.register("worker")
        assert short.value.status == 402
        owner = owner_key(cfg.folder.key("owner"))
        fund_workers(url, owner, workers, cfg.pool.stake)
        with PoolClient(url, identities["worker-0"]) as worker:
            joined = worker.register("worker")
            assert (joined.balance, joined.stake) == (0.0, cfg.pool.stake)
        fund_workers(url, owner, workers, cfg.pool.stake)
        assert [
            m.balance for m in PoolClient(url, None).status().members if m.role == "worker"
        ] == [0.0]
        with PoolClient(url, identities["trainer"]) as trainer:
            assert trainer.register("trainer", url="http://127.0.0.1:1").role == "trainer"
        with PoolClient(url, identities["worker-0"]) as worker:
            assert worker.register("worker").role == "worker"
            # A worker's key is not on the allowlist: it cannot pose as a trusted role.
            with pytest.raises(PoolRefused) as refused:
                worker.register("validator")
            assert refused.value.status == 403
        shown = subprocess.run(
            [sys.executable, "-m", "swarmrl", "status", "--orchestrator", url, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        members = {m["address"]: m["role"] for m in json.loads(shown.stdout)["members"]}
        assert members == {
            identities["trainer"].address: "trainer",
            identities["worker-0"].address: "worker",
        }

        pid = sup.roles["orchestrator"].proc.pid
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while sup.restarts.get("orchestrator", 0) == 0:
            assert time.monotonic() < deadline, "the orchestrator was not restarted"
            sup.poll()
            time.sleep(0.1)
        wait_for_orchestrator(sup, url)  # the same URL after the restart
        status = pool_status(url)
        assert status is not None
        assert {m.address for m in status.members} == set(members)
        assert (cfg.folder.ledger).is_file() and (cfg.folder.secret).is_file()
    finally:
        sup.stop()
    assert pool_status(url, timeout=1) is None
