"""Benchmark: a ≥100M-parameter model through the whole pool, with vLLM workers and a 2-rank trainer.

The path to real models, run end to end on this machine: the 113 M Llama of
``benchmarks/big_model.py`` (built first when ``--model`` is missing), two workers on
the vLLM engine, every file judged by the validator, the trainer at 2 ranks under
torchrun with FSDP2, each checkpoint broadcast through the origin and a relay (deltas
on, as by default). It runs ``swarmrl run`` exactly as a user would, then reads the run
folder and prints: wall time, seconds per step (median) and the trainer's share of it,
files judged and accepted, the vLLM engines' start and in-place swap times, each
policy's fetch (delta or full, bytes, seconds), the bytes the origin and relay served,
and the trainer's own start line (size, ranks, sharding).

Run it in the vLLM venv (docs/architecture.md):
    .vllm-venv/bin/python benchmarks/bench_big_pool.py [--model DIR] [--steps 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_flags(model: Path, steps: int, out: Path, name: str) -> list[str]:
    return [
        "--run_name", name,
        "--output_dir", str(out),
        "--fresh",
        "--model.path", str(model),
        "--inference.engine", "vllm",
        "--trainer.ranks", "2",
        "--trainer.steps", str(steps),
        "--validator.fraction", "1",
        "--trainer.batch_samples", "16",
        "--worker.prompts_per_file", "2",
        "--sampling.group_size", "4",
        "--sampling.max_new_tokens", "48",
        "--task.eval_size", "32",
        "--trainer.optimizer_steps", "2",
    ]  # fmt: skip


def lines(path: Path, pattern: str) -> list[re.Match[str]]:
    rx = re.compile(pattern)
    if not path.exists():
        return []
    return [m for line in path.read_text().splitlines() if (m := rx.search(line))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("outputs/llama-113m"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("outputs"))
    parser.add_argument("--name", default="big-pool")
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "big_model.py"), str(args.model)], check=True)
    command = [
        sys.executable,
        "-m",
        "swarmrl",
        "run",
        *run_flags(args.model, args.steps, args.out, args.name),
    ]
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - start

    run = args.out / args.name
    logs = run / "logs"
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r["step_seconds"] for r in records[1:]]  # step 0 also waits for the first files
    train = [r["train_seconds"] for r in records[1:]]
    started = [
        float(m[1])
        for p in logs.glob("worker-*.log")
        for m in lines(p, r"vLLM engine started in ([\d.]+) s")
    ]
    swaps = [
        float(m[1])
        for p in logs.glob("worker-*.log")
        for m in lines(p, r"swapped in place in ([\d.]+) s")
    ]
    fetches = [
        (m[2], int(m[3]), float(m[4]))
        for p in logs.glob("worker-*.log")
        for m in lines(p, r"fetched policy (\d+) by (\w+): (\d+) bytes in ([\d.]+) s")
    ]
    trainer_line = lines(logs / "trainer.log", r"trainer: (.*)")
    validation = summary["validation"]
    print()
    print(f"trainer:               {trainer_line[0][1] if trainer_line else '(no start line)'}")
    print(
        f"wall:                  {wall:.0f} s for {summary['final_step']} steps (swarmrl run: {summary['wall_seconds']:.0f} s)"
    )
    if steps:
        print(
            f"seconds per step:      {statistics.median(steps):.1f} (median of steps 1-{len(steps)}; training {statistics.median(train):.1f} s of it)"
        )
    print(f"trainer idle:          {summary['trainer_idle_fraction']:.2f}")
    print(
        f"files:                 {summary['files_uploaded']} uploaded, {validation['accepted']} accepted, {validation['rejected']} rejected by the validator"
    )
    print(
        f"held-out (32):         {summary['accuracy_before']:.3f} -> {summary['accuracy_after']:.3f}; length error {summary['length_error_before']:.2f} -> {summary['length_error_after']:.2f}"
    )
    if started:
        print(f"vLLM engine start:     {', '.join(f'{s:.1f}' for s in started)} s")
    if swaps:
        print(
            f"policy swap in place:  median {statistics.median(swaps):.2f} s [{min(swaps):.2f}, {max(swaps):.2f}] ({len(swaps)} swaps)"
        )
    for kind in sorted({k for k, _, _ in fetches}):
        got = [(b, s) for k, b, s in fetches if k == kind]
        print(
            f"{f'policy fetch ({kind}):':<23}{len(got)}, median {statistics.median(b for b, _ in got) / 1e6:.0f} MB "
            f"in {statistics.median(s for _, s in got):.1f} s"
        )
    served = summary["bytes_served"]
    print("bytes served:          " + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in served.items()))
    print(f"slashings:             {summary['slashings']}; restarts {summary['restarts_total']}")


if __name__ == "__main__":
    main()
