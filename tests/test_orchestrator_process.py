"""The orchestrator as its own process, killed with SIGKILL mid-run and restarted: nothing
issued, submitted or judged is lost, and no old request can be replayed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from pool_fixtures import JSON, pool_id, rollout_file
from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.ledger import Ledger, check_ledger, snapshot
from swarmrl.protocol import PoolClient, PoolRefused


def start(tmp_path, allowlist) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarmrl.orchestrator",
            "--port",
            "0",
            "--ledger",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--store",
            str(tmp_path / "store"),
            "--secret-file",
            str(tmp_path / "secret"),
            "--allowlist",
            str(allowlist),
            "--batch-samples",
            "8",
            "--prompts-per-assignment",
            "2",
            "--group-size",
            "2",
            "--validation-fraction",
            "1",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline()
    assert line.startswith("orchestrator listening on "), line
    return proc, line.split()[-1]


def ledger_state(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.session() as s:
            return snapshot(s), check_ledger(s)
    finally:
        ledger.close()


@pytest.mark.slow
def test_killed_orchestrator_restarts_with_everything(tmp_path):
    trainer, validator, worker = Identity.generate(), Identity.generate(), Identity.generate()
    allowlist = tmp_path / "allowlist"
    allowlist.write_text(f"{trainer.address} trainer\n{validator.address} validator\n")
    proc, url = start(tmp_path, allowlist)
    try:
        t, v, w = (PoolClient(url, k) for k in (trainer, validator, worker))
        t.register("trainer")
        v.register("validator")
        w.register("worker")
        t.announce_checkpoint(0, "ab" * 32)
        done = w.assignment(0).assignment
        info = w.upload(done.id, rollout_file(tmp_path / "a.parquet", worker.address, done))
        v.post_verdict(info.file_hash, True)
        pending = w.assignment(0).assignment
        body = b'{"policy_step": 0}'
        replay = (
            sign_request(worker, "POST", "/v1/assignments", body_digest(body), pool=pool_id(url))
            | JSON
        )
        assert httpx.post(url + "/v1/assignments", content=body, headers=replay).status_code == 200
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before, problems = ledger_state(tmp_path)
    assert problems == []

    proc, url = start(tmp_path, allowlist)
    try:
        assert ledger_state(tmp_path)[0] == before
        t, v, w = (PoolClient(url, k) for k in (trainer, validator, worker))
        # The replayed request is refused: its nonce survived the kill.
        r = httpx.post(url + "/v1/assignments", content=body, headers=replay)
        assert r.status_code == 401 and "nonce" in r.json()["detail"]
        # Open work can still be returned; judged and submitted work is all there.
        second = w.upload(pending.id, rollout_file(tmp_path / "b.parquet", worker.address, pending))
        v.post_verdict(second.file_hash, True)
        listed = {s.file_hash: s.state for s in t.submissions_for_step(0).submissions}
        assert listed[info.file_hash] == "accepted" and len(listed) == 2
        with pytest.raises(PoolRefused) as again:
            w.upload(done.id, tmp_path / "a.parquet")
        assert again.value.status == 409
        status = PoolClient(url, None).status()
        assert [(c.worker, c.samples) for c in status.contributions] == [(worker.address, 8)]
        assert ledger_state(tmp_path)[1] == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM)
