"""Fault figures: kill -9 each process of a default `swarmrl run` in turn and measure recovery.

    python benchmarks/bench_faults.py [--steps 50] [--out /tmp/faults] [run flags ...]

Starts a default run (the embedded model, every other setting at its default; any
further `swarmrl run` flags, e.g. `--model.path DIR --trainer.batch_samples 32`, are
passed on), and each time the trainer has finished a step since the last recovery,
sends SIGKILL to the next process of the pool: worker-0, relay-0, the validator, the
orchestrator, the trainer. For each kill it records the seconds until `swarmrl run` had
restarted the process (from `processes.json`) and until the trainer finished its next
step; at the end, whether the run completed by itself, its held-out accuracy before and
after, the restarts its summary counts, whether every step was trained exactly once, and
the ledger's consistency problems. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmrl.runfolder import RunFolder
from swarmrl.trainer.metrics import read_metrics

ROLES = ("worker-0", "relay-0", "validator", "orchestrator", "trainer")


def _wait(ready, run: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while not ready():
        if run.poll() is not None:
            raise RuntimeError(f"the run ended (code {run.returncode}) while waiting")
        if time.monotonic() - start > timeout:
            raise RuntimeError("timed out")
        time.sleep(0.1)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50, help="trainer.steps of the run")
    parser.add_argument("--out", type=Path, default=None, help="output_dir (default: a temp dir)")
    args, run_flags = parser.parse_known_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="swarmrl-faults-"))
    folder = RunFolder(out / "faults")
    with open(out / "run.log", "w") as log:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "swarmrl",
                "run",
                "--output_dir",
                str(out),
                "--run_name",
                "faults",
                "--trainer.steps",
                str(args.steps),
                *run_flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def pids() -> dict:
        try:
            return json.loads(folder.processes.read_text())
        except (OSError, ValueError):
            return {}

    def trained() -> int:
        return len(read_metrics(folder.metrics))

    kills = []
    try:
        for role in ROLES:
            done = trained()
            _wait(lambda d=done: trained() > d, run, 1800)
            victim = pids()[role]["pid"]
            at_step = trained()
            os.kill(victim, signal.SIGKILL)
            restart = _wait(lambda r=role, v=victim: pids()[r]["pid"] not in (None, v), run, 600)
            next_step = _wait(lambda s=at_step: trained() > s, run, 1800)
            kills.append(
                {
                    "role": role,
                    "killed_after_step": at_step,
                    "restart_seconds": round(restart, 1),
                    "next_step_seconds": round(next_step, 1),
                }
            )
        code = run.wait(timeout=3600)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=60)
    summary = json.loads(folder.summary.read_text()) if folder.summary.exists() else {}
    print(
        json.dumps(
            {
                "run_flags": run_flags,
                "completed": code == 0 and summary.get("final_step") == args.steps,
                "kills": kills,
                "accuracy_before": summary.get("accuracy_before"),
                "accuracy_after": summary.get("accuracy_after"),
                "length_error_before": summary.get("length_error_before"),
                "length_error_after": summary.get("length_error_after"),
                "restarts": summary.get("restarts"),
                "each_step_once": [r.step for r in read_metrics(folder.metrics)]
                == list(range(args.steps)),
                "ledger_problems": summary.get("ledger_problems"),
                "files_uploaded": summary.get("files_uploaded"),
                "files_trained": summary.get("files_trained"),
                "validation": summary.get("validation"),
                "wall_seconds": summary.get("wall_seconds"),
                "run_log": str(out / "run.log"),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
