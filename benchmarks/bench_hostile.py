"""Benchmark: what a decompression bomb costs the validator, against an honest file of its size.

Run: python benchmarks/bench_hostile.py [--repeats N] [--tokens T] [--model DIR]

The bomb is a rollout file of the default run's 64 samples whose completions hold T
(default 100,000) tokens each: all equal, so Parquet compresses them to a few kB, while
a reader that materializes columns before checking them builds 6.4 M-element Python
lists. Its problem ids are padded with random text until the bomb has the byte size of
an honest file of the same run (generated here by the worker's own code).

Each file is judged by the validator process's judging function (``judge_file``: strict
read, duplicate and policy checks, prefill, every check) in its own fresh subprocess,
alternating honest and bomb, N times each. In a subprocess the policy is loaded and one
honest file judged first (warm-up), then the peak resident memory is reset
(``/proc/self/clear_refs``) and the file is judged once: the time is that call's, the
memory is the peak resident set above the resident set before it. The figures printed
are medians and the ratios bomb / honest (the target: <= 1.1 for both).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(run_dir: Path, target: Path, warm: Path) -> dict:
    """In this process: warm up on `warm`, then judge `target` once; time and peak memory."""
    import torch

    from swarmrl.checkpoints import load_policy
    from swarmrl.config import load_config
    from swarmrl.rollouts import SeenFiles
    from swarmrl.runfolder import checkpoint_dir
    from swarmrl.tasks.registry import build_task
    from swarmrl.validator import ValidatorSettings, judge_file

    torch.set_num_threads(1)
    cfg = load_config(run_dir / "config.json")
    loaded: dict[int, tuple] = {}

    def policy(step: int) -> tuple:
        if step not in loaded:
            loaded[step] = load_policy(checkpoint_dir(cfg.folder.checkpoints, step))
        return loaded[step]

    task = build_task(cfg.task)
    settings = ValidatorSettings()
    judge_file(warm, cfg, policy, settings, SeenFiles(), task)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM)
    before = _rss("VmRSS")
    start = time.perf_counter()
    verdict = judge_file(target, cfg, policy, settings, SeenFiles(), task)
    seconds = time.perf_counter() - start
    return {
        "status": verdict.status.value,
        "reason": verdict.reason,
        "seconds": seconds,
        "peak_bytes": _rss("VmHWM") - before,
    }


def _bomb(cfg, tokens: int, size: int, path: Path) -> Path:
    from swarmrl.rollouts import SCHEMA, RolloutMeta

    rows = cfg.worker.prompts_per_file * cfg.sampling.group_size
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * tokens)
    meta = RolloutMeta(
        run_id=cfg.run_name,
        worker_address="0xbomb",
        step=0,
        submission=0,
        num_samples=rows,
        num_nonzero=0,
    )
    rng = np.random.default_rng(0)
    pad = 0
    while True:
        ids = ["add-1-2" + "".join(rng.choice(list("abcdef"), pad)) for _ in range(rows)]
        table = pa.table(
            {
                "problem_id": pa.array(ids),
                "input_tokens": pa.array([[5, 6, 7]] * rows, type=pa.list_(pa.int32())),
                "output_tokens": pa.ListArray.from_arrays(
                    offsets, pa.array(np.full(rows * tokens, 5, dtype=np.int32))
                ),
                "output_logprobs": pa.ListArray.from_arrays(
                    offsets, pa.array(np.zeros(rows * tokens, dtype=np.float32))
                ),
                "rewards": pa.array(np.zeros(rows, dtype=np.float32)),
                "task_rewards": pa.array(np.zeros(rows, dtype=np.float32)),
                "length_penalties": pa.array(np.zeros(rows, dtype=np.float32)),
                "advantages": pa.array(np.zeros(rows, dtype=np.float32)),
                "target_lengths": pa.array(np.full(rows, -1, dtype=np.int32)),
                "policy_step": pa.array(np.zeros(rows, dtype=np.int32)),
                "seed": pa.array(np.arange(rows, dtype=np.int64)),
                "proofs": pa.array([b""] * rows, type=pa.binary()),
            }
        ).cast(SCHEMA)
        table = table.replace_schema_metadata({b"swarmrl": meta.model_dump_json().encode()})
        pq.write_table(table, path)
        if path.stat().st_size >= size * 0.97:
            return path
        pad += max(1, (size - path.stat().st_size) // rows // 2)


def prepare(root: Path, model: Path | None, tokens: int) -> tuple[Path, Path, Path, Path]:
    """A run folder with the default config, an honest file (and a second one for warm-up),
    and a bomb of the honest file's byte size."""
    import os

    import torch

    from swarmrl.assignment import assign
    from swarmrl.checkpoints import load_policy
    from swarmrl.config import load_config
    from swarmrl.generation.rollout import generate_rollouts
    from swarmrl.generation.sampler import SamplingParams
    from swarmrl.model.build import WarmStartRecipe, ensure_default_model
    from swarmrl.rewards import has_signal
    from swarmrl.rollouts import RolloutMeta, write_rollouts
    from swarmrl.runfolder import step_name
    from swarmrl.tasks.registry import build_task

    torch.set_num_threads(1)
    model_dir = model or ensure_default_model(
        Path(tempfile.gettempdir()) / "swarmrl-validator-tests", WarmStartRecipe(steps=30)
    )
    cfg = load_config(None, {"run_name": "bench", "output_dir": str(root)})
    cfg.run_dir.mkdir(parents=True)
    cfg.folder.config.write_text(cfg.model_dump_json(indent=2))
    cfg.folder.checkpoints.mkdir()
    os.symlink(model_dir, cfg.folder.checkpoints / step_name(0))
    policy, tok = load_policy(model_dir)
    task = build_task(cfg.task)
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    honest = []
    for counter in range(2):
        plan = assign(
            cfg.seed,
            "0xhonest",
            0,
            counter,
            num_problems=task.num_train(),
            prompts=cfg.worker.prompts_per_file,
            group_size=cfg.sampling.group_size,
            target_lengths=cfg.task.target_lengths,
        )
        cols = generate_rollouts(policy, tok, task, plan, params, 0, cfg.task.length_alpha).columns
        g = cfg.sampling.group_size
        meta = RolloutMeta(
            run_id=cfg.run_name,
            worker_address="0xhonest",
            step=0,
            submission=counter,
            num_samples=len(cols["rewards"]),
            num_nonzero=sum(
                g
                for i in range(0, len(cols["rewards"]), g)
                if has_signal(cols["rewards"][i : i + g])
            ),
        )
        honest.append(
            write_rollouts(cfg.folder.rollout_step(0) / f"honest-{counter}.parquet", cols, meta)
        )
    bomb = _bomb(cfg, tokens, honest[0].stat().st_size, cfg.folder.rollout_step(0) / "bomb.parquet")
    return cfg.run_dir, honest[0], honest[1], bomb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="subprocesses per file")
    parser.add_argument("--tokens", type=int, default=100_000, help="tokens per bomb completion")
    parser.add_argument("--model", type=Path, default=None, help="model directory")
    parser.add_argument("--measure", nargs=3, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, honest, warm, bomb = prepare(Path(tmp), args.model, args.tokens)
        results: dict[str, list[dict]] = {"honest": [], "bomb": []}
        for _ in range(args.repeats):
            for name, target in (("honest", honest), ("bomb", bomb)):
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", str(run_dir), str(target), str(warm)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        sizes = {"honest": honest.stat().st_size, "bomb": bomb.stat().st_size}
        median = {
            name: {
                key: statistics.median(r[key] for r in runs) for key in ("seconds", "peak_bytes")
            }
            for name, runs in results.items()
        }
        for name in ("honest", "bomb"):
            print(
                f"{name}: {sizes[name]:,} bytes, verdict {results[name][0]['reason'][:110]!r}, "
                f"median {median[name]['seconds'] * 1e3:.1f} ms, "
                f"peak +{median[name]['peak_bytes'] / 2**20:.2f} MiB over {args.repeats} runs"
            )
        print(
            f"bomb / honest: time {median['bomb']['seconds'] / median['honest']['seconds']:.3f}, "
            f"memory {median['bomb']['peak_bytes'] / max(1, median['honest']['peak_bytes']):.3f}"
        )


if __name__ == "__main__":
    main()
