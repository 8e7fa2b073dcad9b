"""End-to-end: the real `swarmrl` commands as separate processes on a tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmrl.checkpoints import list_checkpoints
from swarmrl.rollouts import RolloutMeta, read_rollouts, write_rollouts
from swarmrl.trainer.metrics import read_metrics
from swarmrl.validator.service import read_verdicts

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
]

# Each test starts whole swarms of processes (minutes): `pytest -m "not slow"` skips them.
pytestmark = pytest.mark.slow


def _swarmrl(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarmrl", *args], capture_output=True, text=True, check=False, **kw
    )


def _stale_file(folder: Path, step: int, policy_step: int) -> None:
    n = 4
    cols = {
        "problem_id": ["planted"] * n,
        "input_tokens": [[5, 6]] * n,
        "output_tokens": [[7, 2]] * n,
        "output_logprobs": [[-1.0, -1.0]] * n,
        "rewards": [1.0, 0.0, 0.0, 1.0],
        "task_rewards": [1.0, 0.0, 0.0, 1.0],
        "length_penalties": [0.0] * n,
        "advantages": [1.0, -1.0, -1.0, 1.0],
        "target_lengths": [-1] * n,
        "policy_step": [policy_step] * n,
        "seed": [0, 1, 2, 3],
        "proofs": [b""] * n,
    }
    meta = RolloutMeta(
        run_id="planted",
        worker_address="planted",
        step=step,
        submission=0,
        num_samples=n,
        num_nonzero=n,
    )
    write_rollouts(folder / "planted-00000.parquet", cols, meta)


def test_run_async2_respects_the_bound_and_survives_bad_files(tmp_path, warm_model_dir):
    out = tmp_path / "outputs"
    # Before the run starts, plant step 3's folder with a stale file (policy 0 < 3 - 2)
    # and a file that is not Parquet at all; the trainer must drop/reject both and go on.
    step3 = out / "t" / "rollouts" / "step_000003"
    step3.mkdir(parents=True)
    _stale_file(step3, step=3, policy_step=0)
    (step3 / "garbage-00000.parquet").write_bytes(b"not parquet at all")
    proc = _swarmrl(
        "run",
        "--model.path",
        str(warm_model_dir),
        "--output_dir",
        str(out),
        "--run_name",
        "t",
        "--trainer.steps",
        "5",
        "--async_level",
        "2",
        "--validator.fraction",
        "1",
        *SMALL,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "t" / "summary.json").read_text())
    for key in (
        "accuracy_before",
        "accuracy_after",
        "length_error_before",
        "length_error_after",
        "steps",
        "wall_seconds",
    ):
        assert summary[key] is not None, key
    assert summary["steps"] == 5 and summary["final_step"] == 5
    records = read_metrics(out / "t" / "metrics.jsonl")
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    for r in records:
        assert r.oldest_policy_step >= r.step - 2, r
        assert r.staleness_max <= 2
    step3_record = records[3]
    assert step3_record.dropped_stale >= 4 and step3_record.rejected_files == 1
    log = (out / "t" / "logs" / "trainer.log").read_text()
    assert "garbage-00000.parquet: not a readable Parquet file" in log
    assert 5 in list_checkpoints(out / "t" / "checkpoints")
    # Workers got their policies through the relay, never from the trainer's folder:
    # each download is recorded per server, and only the relay's URL appears.
    config = json.loads((out / "t" / "config.json").read_text())
    relay_url = config["shardcast"]["servers"]
    assert (
        len(relay_url) == 1
        and summary["bytes_served"]["relay-0"] > 0
        and summary["bytes_served"]["origin"] > 0
    )
    for log_file in (out / "t" / "logs").glob("worker-*.jsonl"):
        last = json.loads(log_file.read_text().splitlines()[-1])
        assert (
            set(last["bytes_by_server"]) == {relay_url[0]}
            and last["bytes_by_server"][relay_url[0]] > 0
        )
        assert last["policy_step"] >= 1
    assert any((out / "t" / "worker_cache").glob("worker-*/v*"))
    # Proofs were built off the generation loop, and the summary reports the workers' own
    # figures. A worker's first file waits for the proof process to start (logged with its
    # second file); after that the loop waited for proofs less than building them took.
    gen = proofs = waited = 0.0
    for log_file in (out / "t" / "logs").glob("worker-*.jsonl"):
        files = [json.loads(line) for line in log_file.read_text().splitlines()]
        assert len(files) >= 3, log_file
        gen += sum(f["gen_seconds"] for f in files)
        proofs += sum(f["proof_seconds"] for f in files)
        waited += sum(f["proof_wait_seconds"] for f in files)
        after_start = sum(f["proof_wait_seconds"] for f in files[2:])
        assert after_start < sum(f["proof_seconds"] for f in files[2:]), files
    assert 0 < summary["proof_share_of_generation"] == pytest.approx(proofs / gen, abs=1e-4)
    assert summary["proof_wait_share_of_generation"] == pytest.approx(waited / gen, abs=1e-4)
    kept = set(list_checkpoints(out / "t" / "checkpoints"))
    worker_files = sorted((out / "t" / "rollouts").glob("step_*/worker-*.parquet"), reverse=True)
    checked = next(
        f for f in worker_files if read_rollouts(f)[0].column("policy_step")[0].as_py() in kept
    )
    verdict = _swarmrl("validate", str(checked), "--json", timeout=120)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    # The run's validator process judged every file (fraction 1): the workers' honest
    # files are accepted (or skipped once their checkpoint was pruned), the planted
    # stale file is rejected and the garbage file is unusable.
    verdicts = {"/".join(Path(v["file"]).parts[-2:]): v for v in read_verdicts(out / "t")}
    assert verdicts["step_000003/planted-00000.parquet"]["status"] == "rejected"
    assert "consistency" in verdicts["step_000003/planted-00000.parquet"]["failed_checks"]
    assert verdicts["step_000003/garbage-00000.parquet"]["status"] == "unusable"
    honest = [v for name, v in verdicts.items() if "/worker-" in name]
    assert len(honest) == len(list((out / "t" / "rollouts").glob("step_*/worker-*.parquet")))
    assert all(v["status"] in ("accepted", "skipped") for v in honest), [
        v for v in honest if v["status"] != "accepted"
    ]
    assert sum(v["status"] == "accepted" for v in honest) >= 5
    counts = summary["validation"]
    assert counts["fraction"] == 1 and counts["rejected"] == 1 and counts["unusable"] == 1


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swarmrl", *args],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_killed_trainer_resumes_from_its_checkpoint(tmp_path, warm_model_dir):
    out = tmp_path / "outputs"
    common = [
        "--output_dir",
        str(out),
        "--run_name",
        "r",
        "--trainer.steps",
        "6",
        "--async_level",
        "1",
        *SMALL,
    ]
    trainer_cmd = ["trainer", "--start-model", str(warm_model_dir), *common]
    run_dir = out / "r"
    run_dir.mkdir(parents=True)
    worker = _spawn(["worker", "--address", "w0", *common], tmp_path / "worker.log")
    trainer = _spawn(trainer_cmd, tmp_path / "trainer1.log")
    try:
        deadline = time.time() + 300
        while max(list_checkpoints(run_dir / "checkpoints"), default=0) < 2:
            assert time.time() < deadline, (tmp_path / "trainer1.log").read_text()[-2000:]
            assert trainer.poll() is None, (tmp_path / "trainer1.log").read_text()[-2000:]
            time.sleep(0.1)
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        reached = max(list_checkpoints(run_dir / "checkpoints"))
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
        worker.wait(timeout=60)
    finally:
        for p in (worker, trainer):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r.step for r in records] == list(range(6))  # none lost, none counted twice
    assert (run_dir / "trainer_done.json").exists()
    assert max(list_checkpoints(run_dir / "checkpoints")) == 6
