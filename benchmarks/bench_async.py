"""Benchmark (issue 2b): asynchronous (async level 2) against synchronous (level 0) RL.

Runs the real `swarmrl run` twice with the same model, task, budget (steps, batch,
workers) and seed, once with async_level 2 and once with 0, back to back, and prints
the trainer's idle fraction (time waiting for rollouts / time per step) and the wall
time per training step of each, with their ratios. Evaluation is switched off so the
figures cover training only.

    python benchmarks/bench_async.py [--model DIR] [--steps 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from swarmrl.model.build import ensure_default_model
from swarmrl.trainer.metrics import read_metrics


def run(level: int, model: Path, steps: int, workers: int, out: Path, extra: list[str]) -> dict:
    name = f"async{level}"
    cmd = [
        sys.executable,
        "-m",
        "swarmrl",
        "run",
        "--model.path",
        str(model),
        "--output_dir",
        str(out),
        "--run_name",
        name,
        "--async_level",
        str(level),
        "--trainer.steps",
        str(steps),
        "--worker.count",
        str(workers),
        "--eval_before",
        "false",
        "--eval_after",
        "false",
        *extra,
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    summary = json.loads((out / name / "summary.json").read_text())
    records = read_metrics(out / name / "metrics.jsonl")
    # Time per step from the trainer's own clock, first step excluded (it includes the
    # workers' start-up, which is the same for both levels).
    per_step = [r.step_seconds for r in records[1:]]
    waits = [r.wait_seconds for r in records[1:]]
    return {
        "idle_fraction": sum(waits) / sum(per_step),
        "seconds_per_step": sum(per_step) / len(per_step),
        "wall_seconds": summary["wall_seconds"],
        "staleness_max": summary["staleness_max"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory (default: the embedded model)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    args, extra = parser.parse_known_args()
    model = args.model or ensure_default_model()
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            level: run(level, model, args.steps, args.workers, Path(tmp), extra) for level in (2, 0)
        }
    for level, r in results.items():
        print(
            f"async level {level}: trainer idle {r['idle_fraction']:.3f}, {r['seconds_per_step']:.2f} s/step, "
            f"wall {r['wall_seconds']:.1f} s, max staleness {r['staleness_max']}"
        )
    a, s = results[2], results[0]
    print(
        f"idle fraction async2/sync: {a['idle_fraction'] / max(s['idle_fraction'], 1e-9):.2f}x; "
        f"time per step async2/sync: {a['seconds_per_step'] / s['seconds_per_step']:.2f}x"
    )


if __name__ == "__main__":
    main()
