"""How long one silent worker stalls the pool: a worker cut off for 30 s while it holds an
assignment, with and without speculative re-issue (orchestrator `--speculate`).

    python benchmarks/bench_link_cut.py                      # swarmrl run's timings
    python benchmarks/bench_link_cut.py --heartbeat 10 --assignment-seconds 600

One orchestrator process and `--workers` worker processes (`tests/sim_worker.py`: real
keys, signed requests, heartbeats from a thread like `swarmrl worker`, schema-valid
files after `--gen` seconds of pretend generation) on loopback; this process is the
trainer: it announces checkpoint n+1 as soon as step n is full. At step `--cut-step`
the first worker to take work is stopped with SIGSTOP for `--cut` seconds (to the pool,
a cut link: no heartbeats, no upload), then continued. Reported per mode: each step's
duration, the median, and the stall (the slowest step minus the median of the others);
the ledger check at the end. Each mode runs the same schedule; `--modes` picks them.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from swarmrl.identity import Identity, generate_key_file  # noqa: E402
from swarmrl.ledger import Ledger, check_ledger  # noqa: E402
from swarmrl.protocol import PoolClient  # noqa: E402


def start_orchestrator(tmp: Path, trainer: Identity, args, speculate: bool):
    (tmp / "allowlist").write_text(f"{trainer.address} trainer\n")
    dead = max(1, round(args.dead_seconds / args.heartbeat))
    cmd = [
        sys.executable,
        "-m",
        "swarmrl.orchestrator",
        "--port",
        "0",
        "--ledger",
        f"sqlite:///{tmp / 'ledger.db'}",
        "--store",
        str(tmp / "store"),
        "--secret-file",
        str(tmp / "secret"),
        "--allowlist",
        str(tmp / "allowlist"),
        "--run-id",
        "test",
        "--steps",
        str(args.steps),
        "--batch-samples",
        str(args.batch_samples),
        "--prompts-per-assignment",
        "2",
        "--group-size",
        "2",
        "--prior-yield",
        "1",
        "--surplus",
        str(args.surplus),
        "--validation-fraction",
        "0",
        "--heartbeat-seconds",
        str(args.heartbeat),
        "--unhealthy-after",
        str(max(1, dead // 2)),
        "--dead-after",
        str(dead),
        "--assignment-seconds",
        str(args.assignment_seconds),
        "--speculate" if speculate else "--no-speculate",
    ]
    log = open(tmp / "orchestrator.log", "w")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("orchestrator listening on "):
        raise SystemExit(
            f"the orchestrator did not start: {(tmp / 'orchestrator.log').read_text()}"
        )
    return proc, line.split()[-1]


def start_worker(url: str, tmp: Path, i: int, gen: float):
    key = tmp / f"w{i}.key"
    generate_key_file(key)
    (tmp / f"w{i}").mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "sim_worker.py"),
            url,
            str(key),
            str(tmp / f"w{i}"),
            str(gen),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def run_mode(args, speculate: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-link-cut-") as name:
        tmp = Path(name)
        trainer = Identity.generate()
        orch, url = start_orchestrator(tmp, trainer, args, speculate)
        workers = []
        durations: list[float] = []
        try:
            with PoolClient(url, trainer) as t:
                t.register("trainer")
                t.announce_checkpoint(0, f"{0:064x}")
                workers = [start_worker(url, tmp, i, args.gen) for i in range(args.workers)]
                opened = time.monotonic()
                step = 0
                cut_done = False
                beat_at = time.monotonic()
                while step < args.steps:
                    if step == args.cut_step and not cut_done:
                        cut_done = True
                        # The first worker to report new work at this step is cut off.
                        for _proc, lines in workers:
                            while not lines.empty():
                                lines.get()
                        victim = None
                        while victim is None:
                            for proc, lines in workers:
                                try:
                                    if lines.get(timeout=0.01).startswith("holding"):
                                        victim = proc
                                        break
                                except queue.Empty:
                                    continue
                        victim.send_signal(signal.SIGSTOP)
                        threading.Timer(args.cut, victim.send_signal, (signal.SIGCONT,)).start()
                    if time.monotonic() - beat_at > args.heartbeat:
                        t.heartbeat()  # a trainer that stops beating is declared dead
                        beat_at = time.monotonic()
                    status = httpx.get(f"{url}/v1/status").json()
                    row = next((x for x in status["steps"] if x["step"] == step), None)
                    if row is None or not row["full"]:
                        time.sleep(0.02)
                        continue
                    listed = t.submissions_for_step(step).submissions
                    t.mark_trained(step, [x.file_hash for x in listed])
                    now = time.monotonic()
                    durations.append(now - opened)
                    opened = now
                    step += 1
                    t.announce_checkpoint(step, f"{step:064x}", final=step == args.steps)
                for proc, _ in workers:
                    proc.wait(timeout=args.cut + 60)
        finally:
            for proc, _ in workers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
                    proc.wait(timeout=30)
            orch.terminate()
            orch.wait(timeout=30)
        ledger = Ledger(f"sqlite:///{tmp / 'ledger.db'}")
        try:
            with ledger.session() as s:
                problems = check_ledger(s)
        finally:
            ledger.close()
    # The cut worker may hold work of the step after the current one (max_ahead): the
    # stall is the slowest step's excess over the median of the others. Step 0 also
    # waits for the processes to start, so it is left out.
    slowest = max(range(1, len(durations)), key=durations.__getitem__)
    median = statistics.median(d for i, d in enumerate(durations) if i not in (0, slowest))
    return {
        "speculate": speculate,
        "step_seconds": [round(d, 2) for d in durations],
        "median_step_seconds": round(median, 2),
        "slowest_step": slowest,
        "stall_seconds": round(durations[slowest] - median, 2),
        "ledger_problems": problems,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-samples", type=int, default=8, help="two assignments of 4 samples")
    p.add_argument("--gen", type=float, default=0.5, help="seconds a worker 'generates'")
    p.add_argument("--cut-step", type=int, default=3)
    p.add_argument("--cut", type=float, default=30.0, help="seconds the worker is stopped")
    p.add_argument("--heartbeat", type=float, default=2.0, help="swarmrl run: 2; standalone: 10")
    p.add_argument("--dead-seconds", type=float, default=60.0)
    p.add_argument("--assignment-seconds", type=float, default=120.0)
    p.add_argument(
        "--surplus",
        type=float,
        default=0.0,
        help="the pool's spare share (swarmrl run: 0.1); 0: no spare assignment covers the "
        "cut one, so without speculation its step waits for it",
    )
    p.add_argument("--modes", default="off,on", help="off (--no-speculate), on, or both")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    results = [run_mode(args, mode == "on") for mode in args.modes.split(",")]
    for r in results:
        print(json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
