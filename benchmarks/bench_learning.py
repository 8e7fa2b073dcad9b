"""Benchmark (issue 18): does asynchronous GRPO learn like synchronous, and like TRL?

Runs the real `swarmrl run` (each in its own subprocess, as a user runs it) for N seeds
in each mode, and TRL's `GRPOTrainer` on the same model, task, reward and sample budget
(`benchmarks/trl_grpo.py`, also a subprocess) when `trl` is importable:

| mode | `swarmrl run` flags |
| --- | --- |
| sync | `--async_level 0` |
| async1 | `--async_level 1` |
| async2 | the defaults (async level 2, work issued ahead) |
| async2-stale2 | `--worker.policy_lag 2`: workers generate with the checkpoint two steps older than the newest, so every sample is 2 policies old |
| trl | `benchmarks/trl_grpo.py` (TRL, synchronous, on policy) |

Seed i runs with `--seed i --trainer.seed i`. The runs go back to back, interleaved by
seed (seed 0 of every mode, then seed 1, ...), so a change in the machine's load falls
on all modes alike. Every run evaluates before and after on the held-out split with
`swarmrl.evaluation` (TRL's too), and all figures come from one invocation.

Per run: held-out accuracy and length error after; held-out accuracy at the training's
sampling temperature, the mean of `--draws` (8) samples per problem, evaluated after the
run and outside its wall time (`swarmrl.evaluation`, `draws`): pass@1 of one draw at 0.6
saturates at 1.000 on this task, this one does not; the lowest training-batch task
reward after step 10 (metrics.jsonl `task_reward`); the trainer's idle fraction and
mean staleness; wall time; CPU-seconds of every process of the run (getrusage
RUSAGE_CHILDREN around the subprocess, with this process made a child subreaper so a
grandchild that outlives its parent is still counted); and startup: seconds from the
command's start to its first step record. Per mode: median and min–max over seeds,
accuracy against sync in points, wall time and CPU-seconds over TRL's, and the seeds
on which the mode's accuracy beat TRL's; for `swarmrl run`'s modes, the CPU-seconds of
each kind of process (trainer, workers, orchestrator, validator, relays, and `run`, the
command itself: evaluations, origin server), from each run's `summary.json`.
Everything also goes to OUT/results.json.

    python benchmarks/bench_learning.py                          # 5 seeds, every mode
    python benchmarks/bench_learning.py --seeds 1 --steps 3 --modes sync,async2   # a smoke test
    python benchmarks/bench_learning.py --trainer.lr 5e-5        # other flags go to every run
    python benchmarks/bench_learning.py --seeds 5 --first-seed 5  # seeds 5..9
    python benchmarks/bench_learning.py --reevaluate OUT          # add the sampled accuracy to OUT's runs

Flags it does not know are passed to every run, `swarmrl run` and trl_grpo.py alike;
they must be configuration flags (`--section.field VALUE`), which both accept. TRL
runs under `--trl-python` (default: this interpreter; the `bench` extra installs trl).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarmrl.config import WorkerConfig, add_config_arguments, config_from_args
from swarmrl.model.build import ensure_default_model
from swarmrl.runfolder import checkpoint_dir, latest_checkpoint
from swarmrl.trainer.metrics import read_metrics

SWARM_MODES: dict[str, list[str]] = {
    "sync": ["--async_level", "0"],
    "async1": ["--async_level", "1"],
    "async2": [],
    "async2-stale2": ["--worker.policy_lag", "2"],
}
ALL_MODES = [*SWARM_MODES, "trl"]
TRL_SCRIPT = Path(__file__).with_name("trl_grpo.py")
AFTER_STEP = 10  # "the lowest training reward after step 10" (issue 18)
DRAWS = 8  # samples per held-out problem of the sampled accuracy
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class RunResult:
    """One run's figures; None where the run did not produce them."""

    mode: str
    seed: int
    returncode: int
    log: str
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    accuracy_sampled: float | None = None  # at the sampling temperature, mean of DRAWS draws
    length_error_before: float | None = None
    length_error_after: float | None = None
    min_task_reward_after_10: float | None = None
    steps: int = 0
    idle_fraction: float | None = None
    staleness_mean: float | None = None
    staleness_max: int | None = None
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    first_step_seconds: float | None = None
    orphans_reaped: int = 0
    extra: dict = field(default_factory=dict)


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process (Linux), so their CPU time
    reaches RUSAGE_CHILDREN when `reap_orphans` waits for them."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def reap_orphans() -> int:
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], log: Path) -> tuple[int, float, float, float, int]:
    """(return code, start time, wall seconds, CPU-seconds, orphans reaped) of one command."""
    reap_orphans()
    cpu0 = children_cpu()
    started = time.time()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.time() - started
    reaped = reap_orphans()
    return rc, started, wall, children_cpu() - cpu0, reaped


def lowest_after(records: list[tuple[int, float]]) -> float | None:
    late = [reward for step, reward in records if step > AFTER_STEP]
    return min(late) if late else None


def swarm_run(mode: str, seed: int, args, model: Path, extra: list[str]) -> RunResult:
    name = f"{mode}-seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "swarmrl",
        "run",
        "--fresh",
        "--model.path",
        str(model),
        "--output_dir",
        str(args.out),
        "--run_name",
        name,
        "--seed",
        str(seed),
        "--trainer.seed",
        str(seed),
        "--trainer.steps",
        str(args.steps),
        *SWARM_MODES[mode],
        *extra,
    ]
    log = args.out / f"{name}.log"
    rc, started, wall, cpu, reaped = timed(cmd, log)
    result = RunResult(mode, seed, rc, str(log), wall_seconds=wall, cpu_seconds=cpu)
    result.orphans_reaped = reaped
    run_dir = args.out / name
    records = (
        read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    )
    if records:
        result.steps = len(records)
        result.first_step_seconds = records[0].time - started
        result.min_task_reward_after_10 = lowest_after([(r.step, r.task_reward) for r in records])
        samples = sum(r.samples for r in records)
        result.staleness_mean = (
            sum(r.staleness_mean * r.samples for r in records) / samples if samples else None
        )
        result.staleness_max = max(r.staleness_max for r in records)
    summary_path = run_dir / "summary.json"
    if rc == 0 and summary_path.exists():
        summary = json.loads(summary_path.read_text())
        for key in (
            "accuracy_before",
            "accuracy_after",
            "length_error_before",
            "length_error_after",
        ):
            setattr(result, key, summary[key])
        result.idle_fraction = summary["trainer_idle_fraction"]
        result.extra = {
            "run_wall_seconds": summary["wall_seconds"],
            "samples_generated": summary["samples_generated"],
            "samples_trained": summary["samples_trained"],
            "generated_per_read": summary["generated_per_read"],
            "cpu_seconds_by_process": summary.get("cpu_seconds"),
        }
    return result


def process_kind(name: str) -> str:
    """A process's kind: worker-1 and worker-0 are both `worker`, relay-0 `relay`."""
    head, _, tail = name.rpartition("-")
    return head if head and tail.isdigit() else name


def cpu_by_kind(runs: list[RunResult]) -> dict[str, dict] | None:
    """Per kind of process, the spread over runs of its CPU-seconds (a kind's processes
    added up within a run), from each run's summary; None when no run reported them."""
    per_run = []
    for r in runs:
        cpu = r.extra.get("cpu_seconds_by_process")
        if cpu:
            kinds: dict[str, float] = {}
            for name, seconds in cpu.items():
                kinds[process_kind(name)] = kinds.get(process_kind(name), 0.0) + seconds
            per_run.append(kinds)
    if not per_run:
        return None
    names = sorted({k for kinds in per_run for k in kinds})
    return {k: spread([kinds.get(k, 0.0) for kinds in per_run]) for k in names}


def trl_run(seed: int, args, model: Path, extra: list[str]) -> RunResult:
    name = f"trl-seed{seed}"
    run_dir = args.out / name
    cmd = [
        str(args.trl_python),
        str(TRL_SCRIPT),
        "--out",
        str(run_dir),
        "--model.path",
        str(model),
        "--seed",
        str(seed),
        "--trainer.seed",
        str(seed),
        "--trainer.steps",
        str(args.steps),
        *(["--threads", str(args.trl_threads)] if args.trl_threads else []),
        *extra,
    ]
    log = args.out / f"{name}.log"
    rc, started, wall, cpu, reaped = timed(cmd, log)
    result = RunResult("trl", seed, rc, str(log), wall_seconds=wall, cpu_seconds=cpu)
    result.orphans_reaped = reaped
    metrics = run_dir / "metrics.jsonl"
    records = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    if records:
        result.steps = len(records)
        result.first_step_seconds = records[0]["time"] - started
        result.min_task_reward_after_10 = lowest_after(
            [(r["step"], r["task_reward"]) for r in records]
        )
        result.staleness_mean, result.staleness_max = 0.0, 0
    summary_path = run_dir / "summary.json"
    if rc == 0 and summary_path.exists():
        summary = json.loads(summary_path.read_text())
        for key in (
            "accuracy_before",
            "accuracy_after",
            "length_error_before",
            "length_error_after",
        ):
            setattr(result, key, summary[key])
        result.extra = {
            "trl_version": summary["trl_version"],
            "train_seconds": summary["train_seconds"],
            "script_wall_seconds": summary["wall_seconds"],
            "samples_generated": summary["samples_generated"],
            "torch_threads": summary["torch_threads"],
        }
    return result


def final_model(r: RunResult, out: Path) -> Path | None:
    """The run's last checkpoint (TRL's saved model), None if it left none."""
    run_dir = out / f"{r.mode}-seed{r.seed}"
    if r.mode == "trl":
        return run_dir / "model" if (run_dir / "model").is_dir() else None
    step = latest_checkpoint(run_dir / "checkpoints")
    return None if step is None else checkpoint_dir(run_dir / "checkpoints", step)


def sampled_accuracy(model_dir: Path, extra: list[str]) -> float:
    """Held-out accuracy at the runs' sampling temperature, DRAWS draws a problem."""
    from swarmrl.evaluation import evaluate
    from swarmrl.tasks.registry import build_task

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    cfg = config_from_args(parser.parse_known_args(extra)[0])
    task = build_task(cfg.task)
    return evaluate(
        model_dir, task, cfg, temperature=cfg.sampling.temperature, draws=DRAWS
    ).accuracy


def add_sampled_accuracy(r: RunResult, out: Path, extra: list[str]) -> None:
    model_dir = final_model(r, out) if r.returncode == 0 else None
    if model_dir is not None:
        r.accuracy_sampled = sampled_accuracy(model_dir, extra)


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def run_line(r: RunResult, done: int, total: int) -> str:
    head = f"[{done}/{total}] {r.mode} seed {r.seed}:"
    if r.returncode != 0:
        return f"{head} FAILED (exit {r.returncode}) after {r.wall_seconds:.0f} s; log {r.log}"
    return (
        f"{head} held-out {fmt(r.accuracy_before)} -> {fmt(r.accuracy_after)} "
        f"(sampled x{DRAWS} {fmt(r.accuracy_sampled)}), "
        f"length error {fmt(r.length_error_before, '.2f')} -> {fmt(r.length_error_after, '.2f')}, "
        f"lowest task reward after step {AFTER_STEP} {fmt(r.min_task_reward_after_10, '.2f')}, "
        f"idle {fmt(r.idle_fraction, '.2f')}, staleness {fmt(r.staleness_mean, '.2f')}, "
        f"wall {r.wall_seconds:.1f} s, {r.cpu_seconds:.0f} CPU-s, "
        f"first step at {fmt(r.first_step_seconds, '.1f')} s"
    )


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(runs: list[RunResult], modes: list[str]) -> dict:
    """Per mode: medians and spreads, then the side-by-side ratios against sync and TRL."""
    ok = {m: [r for r in runs if r.mode == m and r.returncode == 0] for m in modes}

    def values(mode: str, key: str) -> list[float]:
        return [getattr(r, key) for r in ok[mode] if getattr(r, key) is not None]

    table: dict[str, dict] = {}
    for mode in modes:
        lows = values(mode, "min_task_reward_after_10")
        table[mode] = {
            "runs": len(ok[mode]),
            "failed": sum(1 for r in runs if r.mode == mode and r.returncode != 0),
            "accuracy_after": spread(values(mode, "accuracy_after")),
            "accuracy_sampled": spread(values(mode, "accuracy_sampled")),
            "length_error_after": spread(values(mode, "length_error_after")),
            "min_task_reward_after_10": min(lows) if lows else None,
            "idle_fraction": spread(values(mode, "idle_fraction")),
            "staleness_mean": spread(values(mode, "staleness_mean")),
            "wall_seconds": spread(values(mode, "wall_seconds")),
            "cpu_seconds": spread(values(mode, "cpu_seconds")),
            "first_step_seconds": spread(values(mode, "first_step_seconds")),
            "cpu_seconds_by_kind": cpu_by_kind(ok[mode]),
        }

    def median(mode: str, key: str) -> float | None:
        s = table.get(mode, {}).get(key)
        return s["median"] if s else None

    sync_acc = median("sync", "accuracy_after")
    trl_by_seed = {r.seed: r for r in ok.get("trl", [])}
    for mode in modes:
        row = table[mode]
        acc = median(mode, "accuracy_after")
        row["accuracy_vs_sync_points"] = (
            100 * (acc - sync_acc) if acc is not None and sync_acc is not None else None
        )
        for key in ("wall_seconds", "cpu_seconds"):
            mine, theirs = median(mode, key), median("trl", key)
            row[f"{key}_over_trl"] = mine / theirs if mine is not None and theirs else None
        for key, wins in (
            ("accuracy_after", "wins_over_trl"),
            ("accuracy_sampled", "wins_over_trl_sampled"),
        ):
            pairs = [
                (getattr(r, key), getattr(trl_by_seed[r.seed], key))
                for r in ok[mode]
                if r.seed in trl_by_seed
                and getattr(r, key) is not None
                and getattr(trl_by_seed[r.seed], key) is not None
            ]
            row[wins] = (
                {"won": sum(1 for a, b in pairs if a > b), "pairs": len(pairs)}
                if pairs and mode != "trl"
                else None
            )
    return table


def med_range(s: dict | None, spec: str) -> str:
    if s is None:
        return "-"
    return f"{format(s['median'], spec)} [{format(s['min'], spec)}–{format(s['max'], spec)}]"


def _wins(w: dict | None) -> str:
    return f"{w['won']}/{w['pairs']}" if w else "-"


def print_table(table: dict) -> None:
    columns = [
        ("mode", lambda m, r: m),
        ("runs", lambda m, r: f"{r['runs']}" + (f" ({r['failed']} failed)" if r["failed"] else "")),
        ("held-out after", lambda m, r: med_range(r["accuracy_after"], ".3f")),
        ("vs sync (pts)", lambda m, r: fmt(r["accuracy_vs_sync_points"], "+.1f")),
        (f"sampled x{DRAWS}", lambda m, r: med_range(r.get("accuracy_sampled"), ".3f")),
        ("length err after", lambda m, r: med_range(r["length_error_after"], ".2f")),
        (f"low reward >{AFTER_STEP}", lambda m, r: fmt(r["min_task_reward_after_10"], ".2f")),
        ("idle", lambda m, r: med_range(r["idle_fraction"], ".2f")),
        ("staleness", lambda m, r: med_range(r["staleness_mean"], ".2f")),
        ("wall s", lambda m, r: med_range(r["wall_seconds"], ".0f")),
        ("CPU-s", lambda m, r: med_range(r["cpu_seconds"], ".0f")),
        ("first step s", lambda m, r: med_range(r["first_step_seconds"], ".1f")),
        (
            "wall/TRL",
            lambda m, r: (
                fmt(r["wall_seconds_over_trl"], ".2f")
                + ("x" if r["wall_seconds_over_trl"] is not None else "")
            ),
        ),
        (
            "CPU/TRL",
            lambda m, r: (
                fmt(r["cpu_seconds_over_trl"], ".2f")
                + ("x" if r["cpu_seconds_over_trl"] is not None else "")
            ),
        ),
        ("wins vs TRL", lambda m, r: _wins(r.get("wins_over_trl"))),
        ("wins sampled", lambda m, r: _wins(r.get("wins_over_trl_sampled"))),
    ]
    cells = [[name for name, _ in columns]] + [
        [get(mode, row) for _, get in columns] for mode, row in table.items()
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    print(
        "medians over seeds [min–max]; 'low reward' = lowest training-batch task reward; "
        f"'sampled' = held-out accuracy at the sampling temperature, {DRAWS} draws a problem"
    )
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for mode, row in table.items():
        kinds = row.get("cpu_seconds_by_kind")
        if kinds:
            parts = ", ".join(f"{k} {med_range(v, '.0f')}" for k, v in kinds.items())
            print(f"{mode}: CPU-seconds by process (a kind's processes added up): {parts}")


def git_state() -> dict:
    repo = Path(__file__).resolve().parent.parent

    def git(*cmd: str) -> str | None:
        done = subprocess.run(["git", *cmd], cwd=repo, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def trl_available(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", "import trl"], capture_output=True, check=False)
    return done.returncode == 0


def choose_modes(args) -> list[str]:
    has_lag = "policy_lag" in WorkerConfig.model_fields
    if args.modes:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in ALL_MODES]
        if unknown:
            raise SystemExit(f"unknown mode(s) {unknown}; choose from {','.join(ALL_MODES)}")
        if "async2-stale2" in modes and not has_lag:
            raise SystemExit("async2-stale2 needs `swarmrl run --worker.policy_lag`, missing here")
        if "trl" in modes and not trl_available(args.trl_python):
            raise SystemExit(
                f"mode trl: {args.trl_python} cannot import trl; "
                'pip install -e ".[bench]" or pass --trl-python'
            )
        return modes
    modes = [m for m in SWARM_MODES if has_lag or m != "async2-stale2"]
    if not has_lag:
        print("note: no --worker.policy_lag in this swarmrl; mode async2-stale2 left out")
    if trl_available(args.trl_python):
        modes.append("trl")
    else:
        print(
            f'note: {args.trl_python} cannot import trl; mode trl left out (pip install -e ".[bench]")'
        )
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated subset of {','.join(ALL_MODES)} (default: all)",
    )
    parser.add_argument("--seeds", type=int, default=5, help="N seeds per mode")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the seeds are FIRST..FIRST+N-1 (default 0)"
    )
    parser.add_argument("--steps", type=int, default=50, help="training steps per run")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("outputs/bench_learning"),
        help="run folders, logs, results.json",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="start model directory (default: the embedded model)",
    )
    parser.add_argument(
        "--trl-python",
        type=Path,
        default=Path(sys.executable),
        help="interpreter that runs trl_grpo.py",
    )
    parser.add_argument(
        "--trl-threads",
        type=int,
        default=None,
        help="torch threads of the TRL run (default: torch's)",
    )
    parser.add_argument(
        "--reevaluate",
        type=Path,
        default=None,
        metavar="OUT",
        help="run nothing: add the sampled accuracy to the runs of OUT/results.json (an "
        "invocation made without it), print the table again and update the file",
    )
    args, extra = parser.parse_known_args()
    if args.reevaluate is not None:
        reevaluate(args.reevaluate)
        return
    modes = choose_modes(args)
    args.out.mkdir(parents=True, exist_ok=True)
    model = (args.model or ensure_default_model()).resolve()
    subreaper = become_subreaper()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    plan = [(seed, mode) for seed in seeds for mode in modes]
    print(
        f"{len(plan)} runs: modes {','.join(modes)} × seeds {seeds[0]}..{seeds[-1]}, "
        f"{args.steps} steps each; model {model}; extra flags {extra or 'none'}; out {args.out}"
    )
    started = time.time()
    code = git_state()  # what ran: taken before the runs, not after
    runs: list[RunResult] = []
    for done, (seed, mode) in enumerate(plan, 1):
        if mode == "trl":
            result = trl_run(seed, args, model, extra)
        else:
            result = swarm_run(mode, seed, args, model, extra)
        add_sampled_accuracy(result, args.out, extra)  # after the run, outside its wall time
        runs.append(result)
        print(run_line(result, done, len(plan)), flush=True)
    table = aggregate(runs, modes)
    print()
    print_table(table)
    results = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        **code,
        "model": str(model),
        "modes": modes,
        "seeds": list(seeds),
        "steps": args.steps,
        "draws": DRAWS,
        "extra_flags": extra,
        "cpu_count": os.cpu_count(),
        "subreaper": subreaper,
        "wall_seconds": time.time() - started,
        "runs": [asdict(r) for r in runs],
        "table": table,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nresults written to {args.out / 'results.json'}")


def reevaluate(out: Path) -> None:
    path = out / "results.json"
    results = json.loads(path.read_text())
    runs = [RunResult(**r) for r in results["runs"]]
    for done, r in enumerate(runs, 1):
        add_sampled_accuracy(r, out, results["extra_flags"])
        print(run_line(r, done, len(runs)), flush=True)
    table = aggregate(runs, results["modes"])
    print()
    print_table(table)
    results.update(runs=[asdict(r) for r in runs], table=table, draws=DRAWS)
    path.write_text(json.dumps(results, indent=2))
    print(f"\nresults updated in {path}")


if __name__ == "__main__":
    main()
