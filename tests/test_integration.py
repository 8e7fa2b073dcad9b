"""End-to-end: the real `swarmrl` commands as separate processes on a tiny model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select

from helpers import WARM_MODEL_FLAGS
from swarmrl.assignment import assign_from_seed
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import completion_text
from swarmrl.identity import load_identity
from swarmrl.ledger import Ledger, check_ledger
from swarmrl.ledger.models import Assignment, Submission
from swarmrl.protocol.funding import fund_workers, owner_key
from swarmrl.rewards import group_advantages, score_sample
from swarmrl.rollouts import read_rollouts
from swarmrl.run import free_port, orchestrator_role, pool_roles, pool_status, prepare_pool
from swarmrl.runfolder import RunFolder, list_checkpoints, step_name
from swarmrl.shardcast.server import start_server
from swarmrl.tasks.registry import build_task
from swarmrl.trainer.metrics import read_metrics

SMALL = [
    "--trainer.batch_samples",
    "16",
    "--worker.prompts_per_file",
    "2",
    "--sampling.group_size",
    "4",
    "--task.eval_size",
    "32",
    "--trainer.optimizer_steps",
    "2",
    *WARM_MODEL_FLAGS,
]

# Each test starts whole swarms of processes (minutes): `pytest -m "not slow"` skips them.
pytestmark = pytest.mark.slow


def _swarmrl(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarmrl", *args], capture_output=True, text=True, check=False, **kw
    )


# What may exist in a pool run's folder, each written by `swarmrl run` or a trusted role
# (trainer, validator, relays, orchestrator); a worker writes only in its own folder.
RUN_FOLDER_LAYOUT = re.compile(
    r"^(config\.json|summary\.json|metrics\.jsonl|trainer_status\.json|trainer_done\.json"
    r"|processes\.json|checkpoints/.+|orchestrator/.+|keys/(owner|trainer|validator|relay-\d+)\.key"
    r"|trainer/.+|validator/.+|logs/[\w-]+\.log|shardcast/(origin|relay-\d+)/.+)$"
)


def _recomputed(
    task, tokenizer, table, alpha: float, shaping: str, group_size: int, problems
) -> dict:
    """Each sample's reward and advantage from scratch: the verifier re-run on the decoded
    completion, the length reward and the group normalization."""
    rows = table.to_pydict()
    rewards = [
        score_sample(
            task.score(problems[pid], completion_text(tokenizer, out, tokenizer.eos_token_id)),
            target,
            len(out),
            alpha,
            shaping,
        ).total
        for pid, out, target in zip(
            rows["problem_id"], rows["output_tokens"], rows["target_lengths"], strict=True
        )
    ]
    advantages = [
        a
        for g in range(0, len(rewards), group_size)
        for a in group_advantages(rewards[g : g + group_size]).tolist()
    ]
    return {"rewards": rewards, "advantages": advantages}


def test_the_pool_on_loopback_trains_only_issued_uploaded_recomputed_files(
    tmp_path, warm_model_dir
):
    out = tmp_path / "outputs"
    proc = _swarmrl(
        "run",
        "--model.path",
        str(warm_model_dir),
        "--output_dir",
        str(out),
        "--run_name",
        "t",
        "--trainer.steps",
        "4",
        "--async_level",
        "2",
        "--validator.fraction",
        "1",
        # Checkpoints broadcast rounded to bf16: workers and the validator compute from
        # the rounded weights, and every honest file must still pass (fp32, the default,
        # runs in the other pool tests).
        "--shardcast.dtype",
        "bf16",
        *SMALL,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunFolder(out / "t")
    summary = json.loads(run.summary.read_text())
    for key in (
        "accuracy_before",
        "accuracy_after",
        "length_error_before",
        "length_error_after",
        "samples_generated",
        "samples_read",
        "generated_per_read",
        "proof_share_of_generation",
        "wall_seconds",
    ):
        assert summary[key] is not None, key
    assert summary["steps"] == 4 and summary["final_step"] == 4
    records = read_metrics(run.metrics)
    assert [r.step for r in records] == [0, 1, 2, 3]
    for r in records:
        assert r.oldest_policy_step >= r.step - 2, r
        assert r.staleness_max <= 2

    # No worker touched the run folder: everything in it belongs to the run's layout,
    # and the only rollout files are the orchestrator's store and the trusted roles' inboxes.
    written = [p.relative_to(run.root).as_posix() for p in run.root.rglob("*") if p.is_file()]
    assert [p for p in written if not RUN_FOLDER_LAYOUT.match(p)] == []
    assert not run.rollouts.exists()
    inboxes = (run.store, run.trainer_inbox, run.validator_inbox)
    for path in run.root.rglob("*.parquet"):
        assert any(path.is_relative_to(place) for place in inboxes), path
    # Each worker kept its key and stats in its own folder, and uploaded everything.
    for i in range(2):
        home = run.worker_dir(i)
        assert (home / "key").is_file() and (home / "stats.jsonl").is_file()
        assert not list((home / "outbox").glob("*.parquet")), home

    # Every trained file was issued to its uploader, uploaded, stored and recorded; the
    # ledger is consistent; the rewards and advantages trained on are the recomputed ones.
    cfg = load_config(run.config)
    task = build_task(cfg.task)
    tokenizer = load_policy(warm_model_dir)[1]
    ledger = Ledger(f"sqlite:///{run.ledger}")
    try:
        with ledger.session() as session:
            assert check_ledger(session) == []
            submissions = list(session.scalars(select(Submission)))
            assignments = {a.id: a for a in session.scalars(select(Assignment))}
    finally:
        ledger.close()
    trained = [s for s in submissions if s.trained_step is not None]
    assert len(trained) >= 4 and summary["files_trained"] == len(trained)
    assert summary["samples_generated"] == sum(s.num_samples for s in submissions)
    assert summary["files_uploaded"] == len(submissions)
    for s in trained:
        issued = assignments[s.assignment_id]
        assert (issued.worker, issued.step) == (s.worker, s.step)
        stored = run.store / s.stored_name
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == s.file_hash, stored
        table, meta = read_rollouts(stored)
        assert (meta.submission, meta.worker_address, meta.run_id) == (issued.id, s.worker, "t")
        chosen = assign_from_seed(
            issued.seed,
            num_problems=task.num_train(),
            prompts=issued.prompts,
            group_size=issued.group_size,
            target_lengths=cfg.task.target_lengths,
        )
        problems = {
            p.problem_id: p for p in (task.train_problem(i) for i in chosen.problem_indices)
        }
        want = _recomputed(
            task,
            tokenizer,
            table,
            cfg.task.length_alpha,
            cfg.task.length_shaping,
            issued.group_size,
            problems,
        )
        got = table.select(["rewards", "advantages"]).to_pydict()
        assert got["rewards"] == pytest.approx(want["rewards"], abs=1e-5), stored
        assert got["advantages"] == pytest.approx(want["advantages"], abs=1e-4), stored
    assert sum(r.recomputed_mismatch_files for r in records) == 0

    # Workers got their policies through the relay: bytes served by the origin and relay.
    assert summary["bytes_served"]["relay-0"] > 0 and summary["bytes_served"]["origin"] > 0
    # Each process's CPU-seconds: every role that ran (each imported torch or at least
    # Python), and the command's own.
    cpu = summary["cpu_seconds"]
    assert {"orchestrator", "trainer", "worker-0", "validator", "relay-0", "run"} <= set(cpu)
    assert all(seconds > 0 for seconds in cpu.values()), cpu
    # The validator judged what the orchestrator handed it (fraction 1: every file).
    counts = summary["validation"]
    assert counts["fraction"] == 1 and counts["accepted"] >= 4
    assert counts["rejected"] == 0
    # What the workers were sent is the trainer's checkpoint with every weight rounded to
    # bf16, bit for bit; the trainer's own checkpoints stay fp32.
    compared = 0
    for i in range(2):
        for held in sorted(run.worker_dir(i).glob("policies/v*/model.safetensors")):
            step = int(held.parent.name[1:])
            trainer_copy = run.checkpoints / step_name(step) / "model.safetensors"
            if not trainer_copy.exists():
                continue  # pruned by the trainer since
            exact, sent = load_file(trainer_copy), load_file(held)
            assert all(t.dtype == torch.float32 for t in exact.values())
            assert all(torch.equal(sent[k], t.to(torch.bfloat16)) for k, t in exact.items())
            compared += 1
    assert compared >= 1


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swarmrl", *args],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_killed_trainer_resumes_from_its_checkpoint(tmp_path, warm_model_dir):
    """The roles started by hand as an operator would (one worker, no relay: it fetches
    from the origin), the trainer killed mid-run and started again."""
    out = tmp_path / "outputs"
    flags = dict(zip(SMALL[::2], SMALL[1::2], strict=True))
    cfg = load_config(
        overrides={
            "output_dir": str(out),
            "run_name": "r",
            "trainer.steps": 6,
            "async_level": 1,
            "worker.count": 1,
            "validator.fraction": 0,
            **{k.removeprefix("--"): v if v.isalpha() else json.loads(v) for k, v in flags.items()},
        }
    )
    run = cfg.folder
    run.root.mkdir(parents=True)
    run.config.write_text(cfg.model_dump_json())
    keys = prepare_pool(cfg)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    orchestrator = _spawn(orchestrator_role(cfg, port).args, tmp_path / "orchestrator.log")
    origin = start_server(run.shardcast / "origin")
    trainer_role, worker_role = pool_roles(cfg, warm_model_dir, url, keys, [], origin.url)
    trainer_cmd = trainer_role.args
    worker = trainer = None
    try:
        deadline = time.time() + 120
        while pool_status(url) is None:
            assert time.time() < deadline, (tmp_path / "orchestrator.log").read_text()[-2000:]
            time.sleep(0.2)
        # The pool owner funds the worker's stake, as an operator would before it registers.
        fund_workers(
            url, owner_key(run.key("owner")), [load_identity(keys["worker-0"])], cfg.pool.stake
        )
        worker = _spawn(worker_role.args, tmp_path / "worker.log")
        trainer = _spawn(trainer_cmd, tmp_path / "trainer1.log")
        deadline = time.time() + 300
        while max(list_checkpoints(run.checkpoints), default=0) < 2:
            assert time.time() < deadline, (tmp_path / "trainer1.log").read_text()[-2000:]
            assert trainer.poll() is None, (tmp_path / "trainer1.log").read_text()[-2000:]
            time.sleep(0.1)
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        reached = max(list_checkpoints(run.checkpoints))
        assert reached < 6
        restarted = _swarmrl(*trainer_cmd, timeout=300)
        assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
        # The restarted trainer printed steps starting exactly where the checkpoint left off.
        printed = [
            json.loads(line)["step"]
            for line in restarted.stdout.splitlines()
            if line.startswith("{")
        ]
        assert printed == list(range(reached, 6))
        assert worker.wait(timeout=120) == 0  # the final checkpoint's announcement ends it
    finally:
        for p in (worker, trainer, orchestrator):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        origin.stop()
    records = read_metrics(run.metrics)
    assert [r.step for r in records] == list(range(6))  # none lost, none counted twice
    assert run.trainer_done.exists()
    assert max(list_checkpoints(run.checkpoints)) == 6
    ledger = Ledger(f"sqlite:///{run.ledger}")
    try:
        with ledger.session() as session:
            assert check_ledger(session) == []
            trained_steps = {
                s.trained_step
                for s in session.scalars(select(Submission))
                if s.trained_step is not None
            }
    finally:
        ledger.close()
    assert trained_steps == set(range(6))
