"""Benchmark: TOPLOC proof building against generation, and validation against generation.

Run: python benchmarks/bench_validator.py [--files N] [--threads T[,T...]] [--model DIR]

On the default model's architecture (the embedded tiny Llama: hidden 128, 4 layers; by
default a 30-step warm start of it, cached under the temp folder, because timing does
not depend on the weights) and the default run config (8 prompts x 8 samples per file,
up to 48 new tokens, temperature 0.6), for each of N rollout files it times side by
side, in one process with the first of the given torch thread counts:

- generation: the worker's batched sampler for the file's 64 samples;
- proof building: one ``build_proofs_batch`` call for the file's 64 samples, joined
  into the rollout's ``proofs`` values (reported as a share of generation); beside it,
  the worker's own proof time as ``generate_rollouts`` reports it (whatever call
  rollout.py makes);
- TOPLOC verification alone: ``verify_proofs_batch`` on the validator's recomputed
  hidden states, against ``verify_proofs`` per sample (the validator calls the batched one);
- validation prefill: the validator's batched prefill of the same samples;
- full validation: ``validate_rollouts`` (prefill plus every check).

Throughputs are completion tokens per second. The issue's target: validation at least
10x faster per token than generation.

The validator's throughput, at each thread count given (``--threads 1,2``): files,
samples and completion tokens per second of what the validator process does per file
once it is downloaded (``judge_file``: the strict read from disk, the duplicate and
policy-window checks, prefill and every check), each file judged at every thread count
in turn (the order alternating from file to file), so the counts are compared side by
side on the same files.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from swarmrl.assignment import assign
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.model.build import WarmStartRecipe, ensure_default_model
from swarmrl.rollouts import RolloutMeta, SeenFiles, read_rollouts, write_rollouts
from swarmrl.tasks.registry import build_task
from swarmrl.toploc import bytes_to_proofs, proof_column, verify_proofs, verify_proofs_batch
from swarmrl.validator import Status, ValidatorSettings, judge_file, validate_rollouts
from swarmrl.validator.prefill import recompute


def _thread_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"distinct positive thread counts, e.g. 1,2: {text!r}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--files", type=int, default=6, help="rollout files to generate and validate"
    )
    parser.add_argument(
        "--threads",
        type=_thread_counts,
        default=[1],
        help="torch thread counts, comma-separated (e.g. 1,2): the validator's throughput is "
        "measured at each; everything else at the first (the worker's default is 1)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model directory [default: a cached 30-step warm start]",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads[0])
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
    totals = {
        "tokens": 0,
        "generate": 0.0,
        "proofs": 0.0,
        "worker_proofs": 0.0,
        "prefill": 0.0,
        "validate": 0.0,
        "verify_batched": 0.0,
        "verify_per_sample": 0.0,
        "samples": 0,
    }
    judged = dict.fromkeys(args.threads, 0.0)  # thread count -> seconds of judge_file
    with tempfile.TemporaryDirectory() as tmp:
        for counter in range(args.files + 1):  # file 0 warms up and is not counted
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
            batch = generate_rollouts(model, tok, task, plan, params, 0, cfg.task.length_alpha)
            cols = batch.columns
            meta = RolloutMeta(
                run_id="bench",
                worker_address="bench",
                step=0,
                submission=counter,
                num_samples=len(cols["seed"]),
                num_nonzero=batch.num_nonzero,
            )
            table, meta = read_rollouts(
                write_rollouts(Path(tmp) / f"{counter}.parquet", cols, meta)
            )
            start = time.perf_counter()
            proofs = proof_column([g.hidden for g in batch.generations])
            proof_seconds = time.perf_counter() - start
            assert proofs == cols["proofs"], "batched proofs differ from the worker's"
            start = time.perf_counter()
            stats = recompute(
                model,
                cols["input_tokens"],
                cols["output_tokens"],
                temperature=params.temperature,
                top_p=params.top_p,
                eos_id=tok.eos_token_id,
            )
            prefill = time.perf_counter() - start
            hidden = [s.hidden for s in stats]
            split = [
                bytes_to_proofs(p, n_tokens=len(out), hidden_size=model.config.hidden_size)
                for p, out in zip(proofs, cols["output_tokens"], strict=True)
            ]
            start = time.perf_counter()
            verify_proofs_batch(hidden, split)
            verify_batched = time.perf_counter() - start
            start = time.perf_counter()
            [verify_proofs(h, p) for h, p in zip(hidden, split, strict=True)]
            verify_per_sample = time.perf_counter() - start
            start = time.perf_counter()
            verdict = validate_rollouts(table, meta, model, tok, cfg)
            validate = time.perf_counter() - start
            assert verdict.status == "accepted", verdict.reason
            path = Path(tmp) / f"{counter}.parquet"
            order = args.threads if counter % 2 else args.threads[::-1]
            seconds = {}
            for threads in order:
                torch.set_num_threads(threads)
                start = time.perf_counter()
                verdict = judge_file(
                    path, cfg, lambda _step: (model, tok), ValidatorSettings(), SeenFiles(), task
                )
                seconds[threads] = time.perf_counter() - start
                assert verdict.status == Status.ACCEPTED, verdict.reason
            torch.set_num_threads(args.threads[0])
            if counter:
                totals["tokens"] += batch.gen_tokens
                totals["generate"] += batch.gen_seconds
                totals["proofs"] += proof_seconds
                totals["worker_proofs"] += batch.proof_seconds
                totals["verify_batched"] += verify_batched
                totals["verify_per_sample"] += verify_per_sample
                totals["prefill"] += prefill
                totals["validate"] += validate
                totals["samples"] += len(cols["seed"])
                for threads, s in seconds.items():
                    judged[threads] += s
    tokens = totals["tokens"]
    result = {
        "files": args.files,
        "threads": args.threads[0],
        "completion_tokens": tokens,
        "generation_tok_s": round(tokens / totals["generate"]),
        "proof_share_of_generation": round(totals["proofs"] / totals["generate"], 4),
        "worker_proof_share": round(totals["worker_proofs"] / totals["generate"], 4),
        "proof_ms_per_file": round(totals["proofs"] / args.files * 1e3, 2),
        "generation_ms_per_file": round(totals["generate"] / args.files * 1e3, 1),
        "toploc_verify_ms_per_file": round(totals["verify_batched"] / args.files * 1e3, 2),
        "toploc_verify_ms_unbatched": round(totals["verify_per_sample"] / args.files * 1e3, 2),
        "prefill_tok_s": round(tokens / totals["prefill"]),
        "validation_tok_s": round(tokens / totals["validate"]),
        "prefill_speedup": round(totals["generate"] / totals["prefill"], 2),
        "validation_speedup": round(totals["generate"] / totals["validate"], 2),
        "target_speedup": 10.0,
        "target_proof_share": 0.02,
    }
    first = args.threads[0]
    for threads, seconds in judged.items():
        result[f"validator_{threads}t_files_s"] = round(args.files / seconds, 2)
        result[f"validator_{threads}t_samples_s"] = round(totals["samples"] / seconds, 1)
        result[f"validator_{threads}t_tok_s"] = round(tokens / seconds)
        result[f"validator_{threads}t_vs_{first}t"] = round(judged[first] / seconds, 3)
    for key, value in result.items():
        print(f"{key:28s} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
