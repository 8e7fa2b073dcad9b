"""Benchmark (issue 18, item 4): what the offline difficulty filter buys in learning signal.

Draws the run's own assignments (`assign_from_seed`, G samples per prompt, the run's
target lengths and length coefficient) from the unfiltered task and from the task
reading a filtered prompt set (`swarmrl filter --out FILE`), samples them with the same
model through the worker's path (`generate_rollouts`), and prints, side by side, the
samples with signal (in groups whose advantages are not all zero) per sample generated:
by the run's reward (task reward minus the length term; what the trainer's online
filter drops on) and by the task reward alone. The assignment seeds differ from the
filter's sampling seeds, so the figures are on fresh samples, not the ones the filter
selected on.

    swarmrl filter --limit 4096 --out outputs/filtered.jsonl
    python benchmarks/bench_filter.py --filtered outputs/filtered.jsonl [--model DIR] [--prompts 512]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from swarmrl.assignment import assign_from_seed, stable_hash
from swarmrl.checkpoints import load_policy
from swarmrl.config import RunConfig
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.model.build import ensure_default_model
from swarmrl.rewards import has_signal
from swarmrl.tasks.base import Task
from swarmrl.tasks.registry import build_task

PROMPTS_PER_FILE = 8  # the worker's default prompts per assignment


def signal(model, tok, task: Task, cfg: RunConfig, prompts: int, seed: int) -> dict:
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    group = cfg.sampling.group_size
    generated = run_signal = task_signal = passes = 0
    start = time.perf_counter()
    for counter in range(prompts // PROMPTS_PER_FILE):
        assignment = assign_from_seed(
            stable_hash(f"bench-filter|{seed}|{counter}"),
            num_problems=task.num_train(),
            prompts=PROMPTS_PER_FILE,
            group_size=group,
            target_lengths=cfg.task.target_lengths,
        )
        batch = generate_rollouts(
            model,
            tok,
            task,
            assignment,
            params,
            policy_step=0,
            length_alpha=cfg.task.length_alpha,
            capture_hidden=False,
            proofs=False,
        )
        cols = batch.columns
        generated += len(cols["rewards"])
        run_signal += batch.num_nonzero
        passes += int(np.sum(np.asarray(cols["task_rewards"]) >= 1.0))
        for row in range(0, len(cols["task_rewards"]), group):
            task_signal += group if has_signal(cols["task_rewards"][row : row + group]) else 0
    return {
        "samples_generated": generated,
        "signal_per_sample_run_reward": run_signal / generated,
        "signal_per_sample_task_reward": task_signal / generated,
        "task_reward_mean": passes / generated,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filtered", type=Path, required=True, help="`swarmrl filter --out` file")
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded model")
    parser.add_argument("--prompts", type=int, default=512, help="prompts per side")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_default_model()
    model, tok = load_policy(model_dir)
    cfg = RunConfig()
    unfiltered = build_task(cfg.task)
    filtered_cfg = cfg.model_copy(
        update={"task": cfg.task.model_copy(update={"path": str(args.filtered)})}
    )
    filtered = build_task(filtered_cfg.task)
    assert [p.problem_id for p in filtered.eval_problems()] == [
        p.problem_id for p in unfiltered.eval_problems()
    ], "the filtered task must keep the held-out split"
    out = {
        "model": str(model_dir),
        "filtered_file": str(args.filtered),
        "filtered_prompts": filtered.num_train(),
        "group_size": cfg.sampling.group_size,
        "unfiltered": signal(model, tok, unfiltered, cfg, args.prompts, args.seed),
        "filtered": signal(model, tok, filtered, cfg, args.prompts, args.seed),
    }
    for key in ("signal_per_sample_run_reward", "signal_per_sample_task_reward"):
        before, after = out["unfiltered"][key], out["filtered"][key]
        out[f"ratio_{key}"] = after / before if before else None
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
