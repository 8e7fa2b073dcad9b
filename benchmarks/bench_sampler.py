"""Benchmark (issue 2a): our sampling loop against `transformers` `generate`, and vLLM.

Same model, same prompts, same batch, same temperature and length limit, measured side
by side in one run: each repeat times both methods back to back (alternating which goes
first), and the reported figure is the median of the per-repeat ratios, which follows
the shared machine's changing load better than a ratio of two medians. The batch has the shape a worker
samples: `--batch / --group` distinct prompts, each sampled `--group` times (GRPO's G);
`--group 1` gives all-distinct prompts. Throughput counts the completion
tokens each method actually produced (up to and including EOS), so `generate` is not
charged for the padding it computes after a sequence has finished, nor credited for it.

``--vllm`` (in the vLLM venv, docs/architecture.md) adds the worker's vLLM engine
(``generation/vllm_engine.py``: swarmrl's seeded draw in a logits processor) to each
repeat. Its rate counts the engine's generation only; the prefill that gives its
proofs' states and logprobs is reported apart, as a share of that generation time (the
native loop returns the states as it samples).

    python benchmarks/bench_sampler.py [--model DIR] [--batch 64] [--repeats 10] [--vllm]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from swarmrl.checkpoints import load_policy
from swarmrl.generation.sampler import SamplingParams, sample
from swarmrl.model.build import ensure_default_model
from swarmrl.tasks.arithmetic import ArithmeticTask


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory (default: the embedded model)"
    )
    parser.add_argument("--batch", type=int, default=64, help="sequences per batch (>= 32)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO's G)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm", action="store_true", help="also time the vLLM engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_default_model()
    model, tok = load_policy(model_dir)
    task = ArithmeticTask()
    distinct = [
        tok(task.render_prompt(task.train_problem(i * 7919), 32 + 8 * (i % 2)))["input_ids"]
        for i in range(args.batch // args.group)
    ]
    prompts = [p for p in distinct for _ in range(args.group)]
    params = SamplingParams(
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=tok.eos_token_id,
    )

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1

    def ours(seed: int) -> int:
        gens = sample(
            model,
            prompts,
            [seed * 1000 + i for i in range(len(prompts))],
            params,
            pad_id=tok.pad_token_id,
        )
        return sum(len(g.tokens) for g in gens)

    def hf(seed: int) -> int:
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=args.temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.max_new_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        produced = 0
        for row in out[:, width:].tolist():
            produced += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        return produced

    methods = [("ours", ours), ("generate", hf)]
    prefill_shares: list[float] = []
    if args.vllm:
        from swarmrl.generation.vllm_engine import VllmEngine

        engine = VllmEngine(model_dir)

        def vllm(seed: int) -> int:
            gens = engine.sample(
                model,
                prompts,
                [seed * 1000 + i for i in range(len(prompts))],
                params,
                pad_id=tok.pad_token_id,
            )
            prefill_shares.append(engine.prefill_seconds / engine.engine_seconds)
            return sum(len(g.tokens) for g in gens)

        methods.append(("vllm", vllm))
    for _, fn in methods:
        fn(0)  # warm-up
    prefill_shares.clear()
    rates: dict[str, list[float]] = {name: [] for name, _ in methods}
    for r in range(args.repeats):
        for name, fn in methods if r % 2 == 0 else reversed(methods):
            start = time.perf_counter()
            tokens = fn(r + 1)
            seconds = time.perf_counter() - start
            # vLLM's rate: the engine's generation only (its proof prefill is reported apart)
            rates[name].append(tokens / (engine.engine_seconds if name == "vllm" else seconds))
    ratios = [o / g for o, g in zip(rates["ours"], rates["generate"], strict=True)]
    ours_rate, hf_rate = statistics.median(rates["ours"]), statistics.median(rates["generate"])
    print(
        f"model {model_dir}, batch {len(prompts)} ({len(distinct)} prompts x {args.group}), "
        f"max_new_tokens {args.max_new_tokens}, threads {args.threads}"
    )
    print(f"ours:     {ours_rate:9.0f} tokens/s (median of {args.repeats})")
    print(f"generate: {hf_rate:9.0f} tokens/s (median of {args.repeats})")
    print(
        f"ratio ours/generate: {statistics.median(ratios):.2f}x (median of {args.repeats} paired repeats; "
        f"range {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    if args.vllm:
        vllm_ratios = [v / g for v, g in zip(rates["vllm"], rates["generate"], strict=True)]
        print(
            f"vllm:     {statistics.median(rates['vllm']):9.0f} tokens/s (median of {args.repeats})"
        )
        print(
            f"ratio vllm/generate: {statistics.median(vllm_ratios):.2f}x "
            f"(range {min(vllm_ratios):.2f}-{max(vllm_ratios):.2f}x); its proof prefill: "
            f"{statistics.median(prefill_shares):.1%} of its generation time "
            f"(range {min(prefill_shares):.1%}-{max(prefill_shares):.1%})"
        )


if __name__ == "__main__":
    main()
