"""The sharded trainer on a ~100M-parameter Qwen2-shaped model: memory and time per rank.

    python benchmarks/bench_trainer.py                 # 8 samples x 48 tokens, 2 timed steps
    python benchmarks/bench_trainer.py --samples 2 --completion 8 --steps 1   # quicker

A randomly initialised Qwen2-shaped causal LM (hidden 768, 12 layers, GQA 12/2 heads,
vocabulary 32000, tied embeddings: about 100M parameters) is built locally and saved as
a Hugging Face folder. Then, one configuration after the other, each in fresh processes
with one torch thread per rank and glibc's mmap threshold fixed at 64 KiB (so freed
buffers leave the resident set):

- 1 rank: the plain one-process trainer;
- 2 ranks: the same update under FSDP2 (gloo on CPU), launched as torchrun would;
- 1 rank + activation checkpointing per decoder layer.

Each runs one warm-up rollout update (it creates the optimizer state), then `--steps`
timed ones (`rollout_update`, the trainer's own code: old logprobs, GRPO loss,
backward, clipping, AdamW), then gathers the full weights on rank 0 and writes the
published checkpoint (`save_checkpoint`), timed. Reported per rank: the bytes of
parameters + gradients + optimizer state the rank holds (counted from its tensors), its
peak resident memory (ru_maxrss, including the interpreter and libraries) and the peak
above what the process held before loading the model. Printed last: the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from swarmrl.checkpoints import load_policy, save_checkpoint
from swarmrl.trainer import distributed
from swarmrl.trainer.batches import Sample, token_samples
from swarmrl.trainer.update import UpdateSettings, rollout_update

VOCAB = 32000


def build_model(path: Path) -> int:
    """The ~100M Qwen2-shaped model, random weights, saved as a Hugging Face folder."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swarmrl.model.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _samples(n: int, prompt: int, completion: int) -> list[Sample]:
    rng = random.Random(0)
    prompts, completions, advantages = [], [], []
    for _ in range(n):
        prompts.append([rng.randrange(4, VOCAB) for _ in range(prompt)])
        completions.append([rng.randrange(4, VOCAB) for _ in range(completion)])
        advantages.append(rng.choice([-1.0, 1.0]))
    return token_samples(prompts, completions, advantages)


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def child(args) -> None:
    """One configuration, in this process (one rank of it under torchrun)."""
    torch.set_num_threads(1)
    ranks = distributed.join()
    base_rss = _rss_mb()
    model, tok = load_policy(args.model)
    loaded_rss = _rss_mb()
    model = distributed.prepare_model(model, ranks, args.ac, "fp32")
    sharded_rss = _rss_mb()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.99), weight_decay=0.01)
    settings = UpdateSettings(0.6, args.completion, 0.2, 4.0, 0.0, 1.0, None)
    samples = _samples(args.samples, args.prompt, args.completion)
    minibatches = [list(range(len(samples)))]
    rollout_update(model, opt, samples, minibatches, [1e-5], settings, ranks, tok.pad_token_id)
    warm_rss = _rss_mb()
    distributed.barrier(ranks)
    start = time.perf_counter()
    for _ in range(args.steps):
        rollout_update(model, opt, samples, minibatches, [1e-5], settings, ranks, tok.pad_token_id)
    distributed.barrier(ranks)
    step_seconds = (time.perf_counter() - start) / args.steps
    state_bytes = sum(_local_bytes(p) for p in model.parameters())
    state_bytes += sum(_local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    state_bytes += sum(
        _local_bytes(v)
        for per_param in opt.state.values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    weights = distributed.full_state_dict(model, ranks)
    if ranks.is_main:
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(Path(tmp), 1, model, tok, weights)
    save_seconds = time.perf_counter() - start
    mine = {
        "rank": ranks.rank,
        "state_mb": state_bytes / 2**20,
        "peak_rss_mb": peak,
        "peak_above_start_mb": peak - base_rss,
        "rss_after_load_mb": loaded_rss - base_rss,
        "rss_after_shard_mb": sharded_rss - base_rss,
        "rss_after_first_step_mb": warm_rss - base_rss,
    }
    everyone = [mine]
    if ranks.sharded:
        everyone = [None] * ranks.world
        torch.distributed.all_gather_object(everyone, mine)
    if ranks.is_main:
        Path(args.out).write_text(
            json.dumps(
                {"step_seconds": step_seconds, "save_seconds": save_seconds, "ranks": everyone}
            )
        )
    distributed.leave(ranks)
    distributed.exit_rank(0)  # not through the interpreter's shutdown


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(args, ranks: int, ac: bool, out: Path) -> dict:
    cmd = [
        __file__,
        "--child",
        "--model",
        str(args.model),
        "--out",
        str(out),
        "--samples",
        str(args.samples),
        "--prompt",
        str(args.prompt),
        "--completion",
        str(args.completion),
        "--steps",
        str(args.steps),
    ] + (["--ac"] if ac else [])
    # glibc raises its mmap threshold as large blocks are freed, after which FSDP's
    # per-layer gather and reduce buffers come from the heap and stay resident when freed:
    # peak RSS would then measure the allocator's retention, not what the rank holds.
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    if ranks > 1:
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            *cmd,
        ]
    else:
        argv = [sys.executable, *cmd]
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8, help="samples per rollout step")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per sample")
    parser.add_argument("--completion", type=int, default=32, help="completion tokens")
    parser.add_argument("--steps", type=int, default=2, help="timed rollout updates")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ac", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.model = Path(tmp) / "qwen2-100m"
        params = build_model(args.model)
        print(
            f"model: Qwen2-shaped, {params / 1e6:.1f}M parameters; {args.samples} samples x "
            f"{args.prompt + args.completion} tokens per rollout step; 1 thread per rank",
            flush=True,
        )
        results = {}
        for name, ranks, ac in (
            ("1 rank", 1, False),
            ("2 ranks", 2, False),
            ("1 rank + AC", 1, True),
        ):
            results[name] = run_config(args, ranks, ac, Path(tmp) / f"{ranks}-{ac}.json")
            r = results[name]
            for rank in r["ranks"]:
                print(
                    f"{name:12s} rank {rank['rank']}: params+grads+optimizer {rank['state_mb']:7.1f} MB, "
                    f"peak RSS {rank['peak_rss_mb']:7.1f} MB ({rank['peak_above_start_mb']:7.1f} MB above start; "
                    f"after loading {rank['rss_after_load_mb']:.0f}, sharding {rank['rss_after_shard_mb']:.0f}, "
                    f"the first step {rank['rss_after_first_step_mb']:.0f} MB)",
                    flush=True,
                )
            print(
                f"{name:12s} step {r['step_seconds']:.2f} s, gather+save {r['save_seconds']:.2f} s",
                flush=True,
            )
    one, two, ac = results["1 rank"], results["2 ranks"], results["1 rank + AC"]

    def worst(result: dict, key: str) -> float:
        return max(rank[key] for rank in result["ranks"])

    print("\nratios (2 ranks / 1 rank, the larger rank):")
    print(
        f"  params+grads+optimizer per rank: {worst(two, 'state_mb') / worst(one, 'state_mb'):.3f}"
    )
    print(
        f"  peak RSS per rank:               {worst(two, 'peak_rss_mb') / worst(one, 'peak_rss_mb'):.3f}"
    )
    print(
        f"  peak RSS above start per rank:   {worst(two, 'peak_above_start_mb') / worst(one, 'peak_above_start_mb'):.3f}"
    )
    print(f"  step time:                       {two['step_seconds'] / one['step_seconds']:.3f}")
    print(f"  gather+save time:                {two['save_seconds'] / one['save_seconds']:.3f}")
    print("activation checkpointing (1 rank, with / without):")
    print(
        f"  peak RSS above start:            {worst(ac, 'peak_above_start_mb') / worst(one, 'peak_above_start_mb'):.3f}"
    )
    print(f"  step time:                       {ac['step_seconds'] / one['step_seconds']:.3f}")
    print(
        f"gather+save of the {params / 1e6:.0f}M model: {one['save_seconds']:.2f} s (1 rank), {two['save_seconds']:.2f} s (2 ranks)"
    )


if __name__ == "__main__":
    main()
