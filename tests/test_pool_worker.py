"""The worker and the relay as members of the pool: a real orchestrator on loopback, a real
SHARDCAST origin, a relay and a worker in their own processes. The worker takes issued
assignments, generates the issued prompts, uploads its files, and touches nothing but
its own folder."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from helpers import random_model
from pool_fixtures import make_pool, rollout_file
from swarmrl.assignment import assign_from_seed
from swarmrl.identity import Identity, generate_key_file
from swarmrl.inference.policy_source import PolicySource, Prefetch
from swarmrl.inference.worker import (
    Uploader,
    WorkerCounts,
    WorkerHome,
    deliver_leftovers,
)
from swarmrl.ledger import Ledger, Submission
from swarmrl.protocol import PoolClient
from swarmrl.protocol import models as api
from swarmrl.protocol.membership import Membership
from swarmrl.rollouts import read_rollouts
from swarmrl.shardcast.client import FetchError, VersionUnavailableError
from swarmrl.shardcast.origin import Origin
from swarmrl.shardcast.server import start_server
from swarmrl.tasks.arithmetic import ArithmeticTask

RUN = "poolrun"


def _model_dir(dest: Path, seed: int) -> Path:
    model, tok = random_model(seed=seed)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def _spawn(args: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swarmrl", *args],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,
    )


def _wait(what: str, check, timeout: float, procs: list[subprocess.Popen], logs: list[Path]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                pytest.fail(
                    f"{log.name} exited ({proc.returncode}) before {what}:\n{log.read_text()}"
                )
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    pytest.fail(f"timed out waiting for {what}\n{tails}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_worker_serves_the_pool_from_its_own_folder(tmp_path):
    relay_id = generate_key_file(tmp_path / "relay.key")
    pool = make_pool(
        tmp_path,
        run_id=RUN,
        steps=5,
        batch_samples=8,
        prompts_per_assignment=2,
        group_size=4,
        max_new_tokens=12,  # the worker's sampling.max_new_tokens below
        heartbeat_seconds=1.0,
        # The test's own trainer and validator speak only when the test says so.
        unhealthy_after=10_000,
        dead_after=10_000,
        # Step 3 opens with checkpoint 1 and only policy >= 1 may serve it: work for the
        # new policy is there however fast policy 0 filled steps 0..2.
        max_ahead=2,
    )
    with open(pool.config.allowlist, "a") as fh:
        fh.write(f"{relay_id.address} relay\n")
    pool.restart()  # the allowlist is read at start
    origin = Origin(tmp_path / "origin", keep=4, shard_size=64 * 1024)
    origin_server = start_server(origin.root)
    pool.trainer.register("trainer", url=origin_server.url)
    published = origin.publish(0, _model_dir(tmp_path / "m0", 0))
    pool.trainer.announce_checkpoint(0, published.blake3)

    workdir = tmp_path / "worker-0"
    workdir.mkdir()
    worker_id = generate_key_file(workdir / "key")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    outputs = tmp_path / "outputs"  # the run folder's parent: the worker must not create it
    relay_log, worker_log = tmp_path / "relay.log", tmp_path / "worker.log"
    relay = _spawn(
        [
            "relay",
            "--orchestrator",
            pool.url,
            "--key",
            str(tmp_path / "relay.key"),
            "--upstream",
            origin_server.url,
            "--root",
            str(tmp_path / "relay"),
            "--port",
            "0",
            "--poll-s",
            "0.2",
        ],
        relay_log,
        cwd,
    )
    worker = None
    try:
        members = _wait(
            "the relay's registration",
            lambda: [m for m in pool.trainer.status().members if m.role == "relay" and m.url],
            60,
            [relay],
            [relay_log],
        )
        relay_url = members[0].url
        assert members[0].address == relay_id.address
        worker = _spawn(
            [
                "worker",
                "--orchestrator",
                pool.url,
                "--key",
                str(workdir / "key"),
                "--workdir",
                str(workdir),
                "--output_dir",
                str(outputs),
                "--run_name",
                RUN,
                "--sampling.max_new_tokens",
                "12",
                "--worker.poll_seconds",
                "0.1",
                # The pool's recipe (make_pool above): a member that differs is refused.
                "--trainer.steps",
                "5",
                "--trainer.batch_samples",
                "8",
                "--worker.prompts_per_file",
                "2",
                "--sampling.group_size",
                "4",
            ],
            worker_log,
            cwd,
        )
        procs, logs = [relay, worker], [relay_log, worker_log]

        # Every file is chosen for validation here (not listed for the trainer until
        # accepted): the uploads are counted in the pool's status.
        def uploaded(step: int) -> int:
            return sum(s.submissions for s in pool.trainer.status().steps if s.step == step)

        _wait(
            "uploads for step 0",
            lambda: uploaded(0) >= 2,
            240,
            procs,
            logs,
        )
        # With policy 0 the worker may serve steps 0..2 (async bound 2); step 3 needs policy 1.
        pool.trainer.announce_checkpoint(
            1, origin.publish(1, _model_dir(tmp_path / "m1", 1)).blake3
        )

        def stats() -> list[dict]:
            path = workdir / "stats.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            return [json.loads(line) for line in lines]

        _wait(
            "a file generated with policy 1",
            lambda: any(s["policy_step"] == 1 for s in stats()),
            240,
            procs,
            logs,
        )
        final = origin.publish(2, _model_dir(tmp_path / "m2", 2))
        pool.trainer.announce_checkpoint(2, final.blake3, final=True)
        assert worker.wait(120) == 0, worker_log.read_text()
    finally:
        for proc in [worker, relay]:
            if proc is not None:
                _stop(proc)
        origin_server.stop()

    output = worker_log.read_text()
    counts = json.loads(output[output.rindex("{") :].splitlines()[0])
    assert counts["refused"] == 0 and counts["abandoned"] == 0, output
    assert counts["uploaded"] == counts["written"] >= 3

    # Every written file was delivered, and its policy came through the relay.
    home = WorkerHome(workdir)
    assert list(home.outbox.iterdir()) == []
    lines = stats()
    assert len(lines) == counts["written"]
    assert all(set(s["bytes_by_server"]) == {relay_url} for s in lines)

    # The orchestrator recorded each upload against an assignment issued to this worker.
    ledger = Ledger(pool.config.ledger)
    try:
        with ledger.session() as s:
            uploaders = s.scalars(select(Submission.worker)).all()
    finally:
        ledger.close()
    assert len(uploaders) == counts["uploaded"]
    assert set(uploaders) == {worker_id.address}
    assert pool.ledger_problems() == []

    # The files answer the issued prompts: the validator sees the assignment's seed.
    task = ArithmeticTask()
    task_id = pool.validator.next_for_validation()
    assert task_id.submission is not None and task_id.assignment is not None
    path = pool.validator.download(task_id.submission.file_hash, tmp_path / "check.parquet")
    table, meta = read_rollouts(path)
    a = task_id.assignment
    assert (meta.submission, meta.step, meta.worker_address, meta.run_id) == (
        a.id,
        a.step,
        worker_id.address,
        RUN,
    )
    plan = assign_from_seed(
        a.seed,
        num_problems=task.num_train(),
        prompts=a.prompts,
        group_size=a.group_size,
        target_lengths=[32, 40],
    )
    expected = [task.train_problem(i).problem_id for i in plan.problem_indices]
    assert table.column("problem_id").to_pylist() == [p for p in expected for _ in range(4)]

    # Nothing outside the worker's folder: no run folder, nothing in its working directory.
    assert not outputs.exists()
    assert list(cwd.iterdir()) == []


def test_uploads_refused_dropped_and_unreachable_given_up(tmp_path):
    pool = make_pool(tmp_path, validation_fraction=0.0)  # unchecked: listed once uploaded
    pool.trainer.announce_checkpoint(0, "0" * 64)
    worker = pool.workers[0]
    home = WorkerHome(tmp_path / "w")
    home.outbox.mkdir(parents=True)
    counts = WorkerCounts()
    client = PoolClient(pool.url, worker.identity, retry_seconds=0.5)
    uploader = Uploader(client, counts, retry_base=0.05, retry_cap=0.2)

    # A file a previous life of the worker left in its outbox is delivered at start.
    first = worker.assignment(0).assignment
    rollout_file(home.outbox_file(first.id), worker.address, first)
    deliver_leftovers(home, uploader)
    assert counts.uploaded == 1 and list(home.outbox.iterdir()) == []
    assert [s.assignment_id for s in pool.trainer.submissions_for_step(0).submissions] == [first.id]

    # A refusal is final: logged, the file dropped, nothing stored; the orchestrator
    # lapses the assignment a refused file was for (no second try) and counts the lapse
    # against the worker, and nothing else.
    second = worker.assignment(0).assignment
    before = pool.ledger_state()
    wrong = rollout_file(home.outbox_file(second.id), worker.address, second, step=second.step + 1)
    assert uploader.deliver(wrong, second.id, second.deadline) is False
    assert counts.refused == 1 and not wrong.exists()
    after = pool.ledger_state()
    changed = {table for table in before if after[table] != before[table]}
    assert changed <= {"assignments", "members"}, changed
    assert len(after["assignments"]) == len(before["assignments"])

    # An orchestrator that stays away: retried until the assignment would lapse, then dropped.
    third = worker.assignment(0).assignment
    path = rollout_file(home.outbox_file(third.id), worker.address, third)
    pool.stop()
    started = time.monotonic()
    assert uploader.deliver(path, third.id, time.time() + 1.0) is False
    assert counts.abandoned == 1 and not path.exists()
    assert time.monotonic() - started < 30
    client.close()


def test_outbox_names_that_are_not_assignment_ids_are_removed(tmp_path):
    pool = make_pool(tmp_path)
    try:
        home = WorkerHome(tmp_path / "w")
        home.outbox.mkdir(parents=True)
        stray = home.outbox / "notanid.parquet"
        stray.write_bytes(b"junk")
        counts = WorkerCounts()
        with PoolClient(pool.url, pool.workers[0].identity, retry_seconds=0.5) as client:
            deliver_leftovers(home, Uploader(client, counts, 0.05, 0.2))
        assert not stray.exists() and counts == WorkerCounts()
    finally:
        pool.stop()


def test_relay_refused_by_the_orchestrator_exits_with_the_reason(tmp_path):
    pool = make_pool(tmp_path)
    try:
        stranger = generate_key_file(tmp_path / "k")
        assert isinstance(stranger, Identity)
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "swarmrl",
                "relay",
                "--orchestrator",
                pool.url,
                "--key",
                str(tmp_path / "k"),
                "--upstream",
                "http://127.0.0.1:9",
                "--root",
                str(tmp_path / "relay"),
                "--port",
                "0",
            ],
            capture_output=True,
            check=False,
            text=True,
            timeout=120,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert result.returncode == 1
        assert "not on the allowlist as a relay" in result.stderr
    finally:
        pool.stop()


def test_a_member_declared_dead_registers_again_and_keeps_beating(tmp_path):
    pool = make_pool(tmp_path, heartbeat_seconds=0.2, unhealthy_after=1, dead_after=2)
    identity = Identity.generate()
    member = Membership(pool.url, identity, "worker", policy_step=lambda: 3)
    try:
        assert member.start().heartbeat_seconds == 0.2
        member.stop()  # silent from now on: the orchestrator declares it dead

        def status() -> str:
            return next(
                m.status for m in pool.trainer.status().members if m.address == identity.address
            )

        deadline = time.monotonic() + 30
        while status() != "dead":
            assert time.monotonic() < deadline, "never declared dead"
            time.sleep(0.1)
        # The same key back (a restarted worker): its first heartbeat registers it again.
        member = Membership(pool.url, identity, "worker", policy_step=lambda: 3)
        assert member.beat().heartbeat_seconds == 0.2
        # It keeps beating in the background. The orchestrator sees it healthy (polled:
        # on a loaded machine one beat can come later than the 0.4 s that marks it dead,
        # and the next beat registers it again).
        member.start()
        while status() != "healthy":
            assert time.monotonic() < deadline + 30, "never healthy again"
            time.sleep(0.05)
    finally:
        member.stop()
        pool.stop()


def test_policy_loaded_only_with_the_announced_bytes(tmp_path):
    origin = Origin(tmp_path / "origin", shard_size=64 * 1024)
    published = origin.publish(0, _model_dir(tmp_path / "m0", 0))
    server = start_server(origin.root)
    try:
        source = PolicySource(tmp_path / "w" / "policies")
        forged = api.CheckpointInfo(step=0, blake3="ab" * 32)
        with pytest.raises(FetchError, match="the orchestrator announced abab"):
            source.load([server.url], forged)
        assert not (tmp_path / "w" / "policies" / "v0").exists()
        with pytest.raises(VersionUnavailableError):
            source.load([server.url], api.CheckpointInfo(step=1, blake3=published.blake3))
        model, tok = source.load([server.url], api.CheckpointInfo(step=0, blake3=published.blake3))
        assert model.config.hidden_size == 64 and tok.eos_token_id is not None
        assert source.bytes_by_server == {server.url: published.file_size}
    finally:
        server.stop()


def test_a_policy_fetched_in_the_background_is_taken_whole_or_with_its_error(tmp_path):
    """The worker's background fetch: one at a time, its result (or the exception it
    raised) handed over once, and the policy loaded from it the announced one."""
    origin = Origin(tmp_path / "origin", shard_size=64 * 1024)
    published = origin.publish(0, _model_dir(tmp_path / "m0", 0))
    server = start_server(origin.root)
    source = PolicySource(tmp_path / "w" / "policies")
    prefetch = Prefetch(source)
    try:
        assert not prefetch.busy and not prefetch.ready
        with pytest.raises(RuntimeError, match="no finished policy fetch"):
            prefetch.take()
        forged = api.CheckpointInfo(step=0, blake3="ab" * 32)
        prefetch.start([server.url], forged)
        with pytest.raises(RuntimeError, match="still being fetched"):
            prefetch.start([server.url], forged)
        prefetch.wait(30)
        assert prefetch.ready and prefetch.checkpoint == forged
        with pytest.raises(FetchError, match="the orchestrator announced abab"):
            prefetch.take()
        assert not prefetch.busy and source.fetches == {}
        announced = api.CheckpointInfo(step=0, blake3=published.blake3)
        prefetch.start([server.url], announced)
        prefetch.wait(30)
        model, tok = source.open(prefetch.take())
        assert model.config.hidden_size == 64 and tok.eos_token_id is not None
        assert source.fetches == {"full": 1}
        assert source.bytes_by_server == {server.url: published.file_size}
        prefetch.wait(0.01)  # nothing in flight: returns at once
    finally:
        prefetch.close()
        server.stop()


def test_next_policy_comes_as_a_delta_against_the_one_held(tmp_path):
    """After one real AdamW step the worker fetches the new policy as a delta, counts the
    route, and ends with the published bytes; with deltas off it takes the full shards."""
    import torch

    model, tok = random_model(seed=0)
    m0 = tmp_path / "m0"
    model.save_pretrained(m0)
    tok.save_pretrained(m0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.01)
    tokens = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    model(input_ids=tokens, labels=tokens).loss.backward()
    opt.step()
    m1 = tmp_path / "m1"
    model.save_pretrained(m1)
    tok.save_pretrained(m1)
    origin = Origin(tmp_path / "origin", shard_size=64 * 1024)
    first = origin.publish(0, m0)
    second = origin.publish(1, m1)
    assert second.deltas == (0,)
    server = start_server(origin.root)
    try:
        for deltas, routes in [(True, {"full": 1, "delta": 1}), (False, {"full": 2})]:
            source = PolicySource(tmp_path / f"w-{deltas}" / "policies", deltas=deltas)
            source.load([server.url], api.CheckpointInfo(step=0, blake3=first.blake3))
            reloaded, _ = source.load(
                [server.url], api.CheckpointInfo(step=1, blake3=second.blake3)
            )
            assert source.fetches == routes
            assert all(
                torch.equal(a, b)
                for a, b in zip(
                    reloaded.state_dict().values(), model.state_dict().values(), strict=True
                )
            )
            fetched = source.bytes_by_server[server.url] - first.file_size
            assert (fetched < 0.9 * second.file_size) if deltas else fetched == second.file_size
    finally:
        server.stop()


@pytest.mark.slow
def test_a_member_holding_work_beats_twice_per_interval(tmp_path):
    """The orchestrator re-issues the share of a holder silent for half an interval plus
    slack (speculation.py): so a member holding work beats HOLDING_BEATS times per
    interval, counted from its newest beat, and once per interval otherwise."""
    pool = make_pool(tmp_path, heartbeat_seconds=1.0)
    busy = threading.Event()
    beats: list[float] = []

    class Counted(Membership):
        def beat(self):
            view = super().beat()
            beats.append(time.monotonic())
            return view

    member = Counted(pool.url, Identity.generate(), "worker", busy=busy.is_set)

    def gaps(seconds: float) -> list[float]:
        beats.clear()
        time.sleep(seconds)
        return [b - a for a, b in itertools.pairwise(beats)]

    try:
        member.start()
        idle = gaps(3.5)
        busy.set()
        member.nudge()
        holding = gaps(3.5)
    finally:
        member.stop()
        pool.stop()
    assert len(idle) >= 2 and min(idle) >= 0.95  # never more often than asked
    assert len(holding) >= 4 and min(holding) >= 0.45
    assert statistics.median(holding) < 0.75 < statistics.median(idle)
