"""Benchmark: the worker's engines side by side: our sampling loop, `transformers`
`generate`, and vLLM, with each engine's TOPLOC proof cost.

Same model, same prompts, same batch, same temperature and length limit, measured side
by side in one run: each repeat times every method back to back (alternating the
order), and the reported ratio is the median of the per-repeat ratios to `generate`,
which follows the shared machine's changing load better than a ratio of two medians.
The batch has the shape a worker samples: `--batch / --group` distinct prompts, each
sampled `--group` times (GRPO's G); `--group 1` gives all-distinct prompts. Throughput
counts the completion tokens each method actually produced (up to and including EOS),
so `generate` is not charged for the padding it computes after a sequence has finished,
nor credited for it.

``--vllm`` (in the vLLM venv, docs/architecture.md) adds the worker's vLLM engine
(``generation/vllm_engine.py``: swarmrl's seeded draw in a logits processor). Its rate
counts the engine's generation only. The proof cost column is what a worker pays on top
of generation to write a file's TOPLOC proofs, as a share of that engine's generation
time: the native loop returns the final-norm states as it samples, so its cost is
building the proofs; vLLM's is the prefill that gives the states and logprobs, then
building the proofs. (`generate` is not a worker engine and has no proof column.)

``--device cuda`` runs the model (and vLLM, when installed as `vllm` on a GPU machine)
on the GPU; ``benchmarks/gpu_engines.sh`` runs the whole table there.

    python benchmarks/bench_sampler.py [--model DIR] [--batch 64] [--repeats 10] [--vllm] [--device cpu]
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
from swarmrl.toploc.proofs import build_proofs_batch


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
    parser.add_argument("--device", default="cpu", help="where the model runs: cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_sampler: --device cuda, but torch sees no CUDA device here")
    model_dir = args.model or ensure_default_model()
    model, tok = load_policy(model_dir)
    model.to(device)
    # `generate` is transformers' own: its arm runs on the same weights loaded through it.
    from transformers import AutoModelForCausalLM

    hf_model = (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().to(device)
    )
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
    ids, mask = ids.to(device), mask.to(device)

    def synced() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    # Per call: (completion tokens, generation seconds, proof seconds or None).
    def ours(seed: int) -> tuple[int, float, float | None]:
        start = synced()
        gens = sample(
            model,
            prompts,
            [seed * 1000 + i for i in range(len(prompts))],
            params,
            pad_id=tok.pad_token_id,
        )
        middle = synced()
        build_proofs_batch([g.hidden for g in gens])
        return sum(len(g.tokens) for g in gens), middle - start, time.perf_counter() - middle

    def hf(seed: int) -> tuple[int, float, float | None]:
        torch.manual_seed(seed)
        start = synced()
        with torch.inference_mode():
            out = hf_model.generate(
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
        return produced, time.perf_counter() - start, None

    methods = [("ours", ours), ("generate", hf)]
    if args.vllm:
        from swarmrl.generation.vllm_engine import VllmEngine

        engine = VllmEngine(model_dir)

        def vllm(seed: int) -> tuple[int, float, float | None]:
            gens = engine.sample(
                model,
                prompts,
                [seed * 1000 + i for i in range(len(prompts))],
                params,
                pad_id=tok.pad_token_id,
            )
            start = time.perf_counter()
            build_proofs_batch([g.hidden for g in gens])
            proof = engine.prefill_seconds + time.perf_counter() - start
            return sum(len(g.tokens) for g in gens), engine.engine_seconds, proof

        methods.append(("vllm", vllm))
    for _, fn in methods:
        fn(0)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name, _ in methods}
    proof_shares: dict[str, list[float]] = {name: [] for name, _ in methods}
    for r in range(args.repeats):
        for name, fn in methods if r % 2 == 0 else reversed(methods):
            tokens, seconds, proof = fn(r + 1)
            rates[name].append(tokens / seconds)
            if proof is not None:
                proof_shares[name].append(proof / seconds)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model {model_dir} ({n_params / 1e6:.1f} M parameters, {model.dtype}), device {device}, "
        f"batch {len(prompts)} ({len(distinct)} prompts x {args.group}), "
        f"max_new_tokens {args.max_new_tokens}, threads {args.threads}, {args.repeats} repeats"
    )
    print(f"{'engine':<10} {'tokens/s':>9}  {'vs generate (range)':<22} proof cost (range)")
    for name, _ in methods:
        ratios = [a / g for a, g in zip(rates[name], rates["generate"], strict=True)]
        shares = proof_shares[name]
        proof = (
            f"{statistics.median(shares):.1%} ({min(shares):.1%}-{max(shares):.1%})"
            if shares
            else "-"
        )
        print(
            f"{name:<10} {statistics.median(rates[name]):9.0f}  "
            f"{statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"
            f"{'':<6} {proof}"
        )
    print(
        "tokens/s: median over repeats; vs generate: median of the paired per-repeat ratios; "
        "proof cost: share of the engine's generation time"
    )


if __name__ == "__main__":
    main()
