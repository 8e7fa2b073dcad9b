"""Benchmark: what TOPLOC proof building costs the worker's generation loop.

Run: python benchmarks/bench_proof_pipeline.py [--files N] [--rounds R] [--threads T]

On the default model's architecture and config (64 samples per file, up to 48 new
tokens; by default a 30-step warm start, cached under the temp folder), it runs the
worker's loop body (generate a file, build its proofs, write it atomically) three
ways, side by side, alternating in R rounds of N files each:

- none: generate only, no proofs and no file (the floor);
- inline: proofs built right after sampling in the same thread, then the write (what
  the worker did before the finisher);
- process: what the worker does: the file goes to the ``FileFinisher``, whose thread has
  a child process build the proofs and then writes, while the loop generates the next
  file;
- thread: the same, but the proofs are built in the finisher's thread itself (to show
  what sharing the GIL with the sampling loop costs).

It prints wall time per file for each (median over rounds), and the extra wall time
over "none" (proofs and the write together) as a share of generation time, taken per
round against that round's "none" and then the median over rounds. "proof_cpu_share_<mode>" is the proofs' own
time over generation time (measured where they are built). The issue's target: proof building <= 2% of
generation time, off the generation's critical path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from swarmrl.assignment import assign
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.inference.finisher import FileFinisher
from swarmrl.model.build import WarmStartRecipe, ensure_default_model
from swarmrl.rollouts import RolloutMeta, write_rollouts
from swarmrl.tasks.registry import build_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8, help="files per round and mode")
    parser.add_argument(
        "--rounds", type=int, default=8, help="rounds (modes alternate within each)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the worker's default is 1)"
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model directory [default: a cached 30-step warm start]",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_default_model(
        Path(tempfile.gettempdir()) / "swarmrl-validator-tests", WarmStartRecipe(steps=30)
    )
    model, tok = load_policy(model_dir)
    cfg = load_config(None, {"run_name": "bench"})
    task = build_task(cfg.task)
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    counter = 0

    def one_file(folder: Path, proofs: bool):
        nonlocal counter
        counter += 1
        plan = assign(
            cfg.seed,
            "bench",
            0,
            counter,
            num_problems=task.num_train(),
            prompts=cfg.worker.prompts_per_file,
            group_size=cfg.sampling.group_size,
            target_lengths=cfg.task.target_lengths,
        )
        batch = generate_rollouts(
            model, tok, task, plan, params, 0, cfg.task.length_alpha, proofs=proofs
        )
        meta = RolloutMeta(
            run_id="bench",
            worker_address="bench",
            step=0,
            submission=counter,
            num_samples=len(batch.columns["seed"]),
            num_nonzero=batch.num_nonzero,
        )
        return folder / f"bench-{counter:05d}.parquet", batch, meta

    def run(mode: str, folder: Path) -> tuple[float, float, float]:
        """(wall seconds, generation seconds, proof seconds) for one round."""
        gen = proof = 0.0
        start = time.perf_counter()
        if mode in finishers:
            finisher = finishers[mode]
            batches = []
            for _ in range(args.files):
                path, batch, meta = one_file(folder, proofs=False)
                finisher.submit(path, batch, meta)
                batches.append(batch)
            finisher.drain()
            gen = sum(b.gen_seconds for b in batches)
            proof = sum(b.proof_seconds for b in batches)
        else:
            for _ in range(args.files):
                path, batch, meta = one_file(folder, proofs=mode == "inline")
                if mode == "inline":
                    write_rollouts(path, batch.columns, meta)
                gen += batch.gen_seconds
                proof += batch.proof_seconds
        return time.perf_counter() - start, gen, proof

    finishers = {"process": FileFinisher(processes=True), "thread": FileFinisher(processes=False)}
    modes = ["none", "inline", "thread", "process"]
    walls: dict[str, list[float]] = {m: [] for m in modes}
    gens: dict[str, list[float]] = {m: [] for m in modes}
    proof_cpu: dict[str, list[float]] = {m: [] for m in modes[1:]}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            run(mode, Path(tmp))  # warm-up (and the child's start), not counted
        for r in range(args.rounds):
            for mode in (
                modes[r % len(modes) :] + modes[: r % len(modes)]
            ):  # rotate the order between rounds
                wall, gen, proof = run(mode, Path(tmp))
                walls[mode].append(wall / args.files)
                gens[mode].append(gen / args.files)
                if mode != "none":
                    proof_cpu[mode].append(proof / gen)
    statistics.median(walls["none"])
    gen_time = statistics.median(gens["none"])
    result = {
        "files": args.files * args.rounds,
        "threads": args.threads,
        "generation_ms_per_file": round(gen_time * 1e3, 1),
        **{f"wall_ms_per_file_{m}": round(statistics.median(walls[m]) * 1e3, 1) for m in modes},
        **{f"proof_cpu_share_{m}": round(statistics.median(proof_cpu[m]), 4) for m in modes[1:]},
        # Paired within each round (the modes ran back to back), then the median over rounds.
        **{
            f"{m}_overhead_share": round(
                statistics.median(
                    (w - w0) / g0
                    for w, w0, g0 in zip(walls[m], walls["none"], gens["none"], strict=True)
                ),
                4,
            )
            for m in modes[1:]
        },
        "target_share": 0.02,
    }
    for finisher in finishers.values():
        finisher.close()
    for key, value in result.items():
        print(f"{key:28s} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
