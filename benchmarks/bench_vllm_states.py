"""Benchmark (issue 21): the two ways a vLLM worker can get the final-norm states TOPLOC needs.

Run in the vLLM venv (docs/architecture.md):
    .vllm-venv/bin/python benchmarks/bench_vllm_states.py [--model DIR] [--batch 64] [--repeats 7]

1. **Prefill (what the worker does)**: the engine generates; then one teacher-forced
   prefill of each finished sequence on the worker's own model gives the states and the
   logprobs (``vllm_engine.prefilled_generations``).
2. **Hook inside the engine**: a forward hook on the final norm of vLLM's own model
   (reached with ``collective_rpc`` in the engine's in-process worker) copies the state
   of every token the engine computes, as it computes it, into CPU memory. What this
   costs is what the engine's generation slows by. It is a lower bound on the hook way:
   the rows still have to be mapped back to requests (prefill rows, decode rows, and
   preempted requests recomputed), and vLLM's logprobs would still need the T-scaled
   recomputation the file records.

Each repeat, on the same prompts and seeds, times the engine without the hook, the
engine with the hook and the prefill, in turn (pairs measured side by side on this
noisy machine). Printed: median and range of each, and the ratios to the engine's
generation without the hook.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.sampler import SamplingParams
from swarmrl.generation.vllm_engine import VllmEngine, prefilled_generations
from swarmrl.model.build import ensure_default_model
from swarmrl.tasks.registry import build_task


class StateTap:
    """A forward hook on vLLM's final norm that keeps a CPU copy of every output."""

    def __init__(self) -> None:
        self.on = False
        self.rows = 0
        self.kept: list[torch.Tensor] = []

    def __call__(self, module, args, output) -> None:
        if not self.on:
            return
        state = output[0] if isinstance(output, tuple) else output
        self.kept.append(state.detach().to("cpu", copy=True))
        self.rows += state.shape[0]


def install(engine: VllmEngine, tap: StateTap) -> str:
    """Hooks ``tap`` on the final norm of the engine's model; returns the module's name."""

    def hook(worker) -> str:
        model = worker.model_runner.model
        norm = model.model.norm
        norm.register_forward_hook(tap)
        return type(norm).__name__

    (name,) = engine.llm.collective_rpc(hook)
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", type=Path, help="a Llama-family fp32 checkpoint (default: the embedded model)"
    )
    parser.add_argument(
        "--batch", type=int, default=64, help="samples per generation (8 prompts x 8)"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the worker's default: 1)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config()
    path = args.model or ensure_default_model()
    model, tok = load_policy(path)
    task = build_task(cfg.task)
    group = cfg.sampling.group_size
    distinct = [
        tok(task.render_prompt(task.train_problem(i * 7919), 32 + 8 * (i % 2)))["input_ids"]
        for i in range(args.batch // group)
    ]
    prompts = [p for p in distinct for _ in range(group)]
    seeds = np.arange(len(prompts), dtype=np.uint64) + 7
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    engine = VllmEngine(path)
    tap = StateTap()
    norm = install(engine, tap)
    print(
        f"model {path}; {len(prompts)} samples per repeat; hook on vLLM's {norm}; {args.threads} thread(s)"
    )
    engine.sample(model, prompts, seeds, params, tok.pad_token_id)  # warm-up (and the first load)
    plain, hooked, prefill, tokens, rows = [], [], [], [], []
    for r in range(args.repeats):
        tap.on = False
        gens = engine.sample(
            model, prompts, seeds + r, params, tok.pad_token_id, capture_hidden=False
        )
        plain.append(engine.engine_seconds)
        tokens.append(sum(len(g.tokens) for g in gens))
        tap.on, tap.rows, tap.kept = True, 0, []
        engine.sample(model, prompts, seeds + r, params, tok.pad_token_id, capture_hidden=False)
        hooked.append(engine.engine_seconds)
        rows.append(tap.rows)
        tap.on = False
        completions = [g.tokens for g in gens]
        start = time.perf_counter()
        prefilled_generations(model, prompts, completions, params, capture_hidden=True)
        prefill.append(time.perf_counter() - start)

    def show(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"

    hook_ratio = [h / p for h, p in zip(hooked, plain, strict=True)]
    prefill_ratio = [f / p for f, p in zip(prefill, plain, strict=True)]
    print(
        f"generated tokens per repeat: {statistics.median(tokens):.0f}; states the hook copied: {statistics.median(rows):.0f}"
    )
    print(f"engine generation, no hook:   {show(plain)}")
    print(f"engine generation, with hook: {show(hooked)}")
    print(f"prefill on the worker's model: {show(prefill)}")
    print(
        f"hook: generation x{statistics.median(hook_ratio):.3f} "
        f"[{min(hook_ratio):.3f}-{max(hook_ratio):.3f}] (extra {statistics.median(hook_ratio) - 1:.1%})"
    )
    print(
        f"prefill: {statistics.median(prefill_ratio):.1%} of generation "
        f"[{min(prefill_ratio):.1%}-{max(prefill_ratio):.1%}]"
    )


if __name__ == "__main__":
    main()
