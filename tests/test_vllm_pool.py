"""A whole `swarmrl run --inference.engine vllm`: vLLM workers, one of them cheating.

Runs only where vLLM imports (the vLLM venv, docs/architecture.md; `.ci/run` builds one
and runs this file in it); elsewhere it is skipped with the reason. The pool trains a
few steps with every file judged (`--validator.fraction 1`): the honest vLLM worker's
files all pass the validator's replay, proofs and logprob checks, and the cheater, which
samples at half the run's temperature on its own vLLM engine and claims the run's, is
rejected, slashed and ejected.

The cheater has to upload a file before the run ends for it to be caught: its vLLM
engine starts beside the honest worker's, and on two busy cores one of the two warm-ups
can take several seconds longer (4.4 s against 0.6 s here on 2026-12-07; in CI once
longer than the whole run of 3 steps, which the honest worker trains in ~4 s once its
engine is up). The run is long enough to leave the slower engine that much and more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from helpers import WARM_MODEL_FLAGS, vllm_only
from swarmrl.identity import load_identity
from swarmrl.ledger import Ledger, check_ledger
from swarmrl.ledger.models import Submission
from swarmrl.runfolder import RunFolder

pytestmark = [pytest.mark.slow, vllm_only()]

STEPS = 8


def test_a_vllm_pool_trains_validates_and_catches_a_temperature_cheat(
    tmp_path: Path, warm_model_dir: Path
):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmrl",
            "run",
            "--inference.engine",
            "vllm",
            "--model.path",
            str(warm_model_dir),
            "--output_dir",
            str(tmp_path),
            "--run_name",
            "v",
            "--adversary",
            "temperature",
            "--worker.count",
            "1",
            "--trainer.steps",
            str(STEPS),
            "--trainer.batch_samples",
            "16",
            "--worker.prompts_per_file",
            "2",
            "--sampling.group_size",
            "4",
            "--validator.fraction",
            "1",
            "--eval_before",
            "false",
            "--eval_after",
            "false",
            *WARM_MODEL_FLAGS,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = RunFolder(tmp_path / "v")
    summary = json.loads(run.summary.read_text())
    assert summary["final_step"] == STEPS and summary["ledger_problems"] == []
    (cheater,) = summary["cheaters"]
    assert cheater["kind"] == "temperature" and cheater["caught"] and cheater["ejected"], (
        cheater,
        proc.stdout[-3000:],
    )
    assert cheater["check"] in ("logprobs", "sampling"), cheater
    assert cheater["slashed"] > 0

    honest = load_identity(run.worker_dir(0) / "key").address
    ledger = Ledger(f"sqlite:///{run.ledger}")
    try:
        with ledger.session() as session:
            assert check_ledger(session) == []
            mine = [s for s in session.scalars(select(Submission)) if s.worker == honest]
    finally:
        ledger.close()
    # Every file judged; no honest vLLM file rejected (a false reject would slash it).
    assert mine and all(s.state != "rejected" for s in mine), [s.state for s in mine]
    assert sum(s.state == "accepted" for s in mine) >= STEPS
    assert any(s.trained_step is not None for s in mine)
    assert summary["accounts"]["worker-0"]["status"] != "ejected"
