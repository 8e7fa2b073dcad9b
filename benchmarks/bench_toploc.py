"""Benchmark: per-chunk cost of building and verifying TOPLOC proofs on this CPU.

Run: python benchmarks/bench_toploc.py [--repeats N] [--threads T]

For hidden sizes 128 (the embedded default model), 896 (Qwen2.5-0.5B) and 4096 (7-8B
models) it times, on one 32-token chunk and on a 512-token sequence (16 chunks), the
median over repeats of ``build_proofs`` and ``verify_proofs``, reported per chunk. The
acceptance target is build + verify of one chunk at hidden 4096 within 2 ms. The field
arithmetic alone (one chunk's interpolation, one chunk's evaluation) is timed too; the
rest of a chunk's cost is mostly the top-k selection, which grows with the hidden size.

Then a rollout file of the default model: 64 sequences of 24-48 tokens at hidden 128
(about 100 chunks, most sequences one full chunk and one short one), proven with one
``build_proofs_batch`` call against one ``build_proofs`` call per sequence, and
verified with ``verify_proofs_batch`` against ``verify_proofs`` per sequence. T torch
threads (default 1, the inference worker's setting).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from swarmrl.toploc import build_proofs, build_proofs_batch, gf, verify_proofs, verify_proofs_batch

CHUNK = 32
TOPK = 128
TARGET_MS = 2.0
FILE_SEQUENCES = 64
FILE_HIDDEN = 128


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bench_hidden(hidden: int, repeats: int) -> dict[str, float]:
    """Per-chunk milliseconds for one hidden size."""
    gen = torch.Generator().manual_seed(hidden)
    one = torch.randn(CHUNK, hidden, generator=gen).to(torch.bfloat16)
    many = torch.randn(16 * CHUNK, hidden, generator=gen).to(torch.bfloat16)
    one_proofs, many_proofs = build_proofs(one), build_proofs(many)
    assert all(c.passed and c.exp_mismatches == 0 for c in verify_proofs(one, one_proofs))

    rng = np.random.default_rng(0)
    # Points as a chunk of this hidden size gives them: below SMALL_DOMAIN, the table path.
    x = rng.choice(min(CHUNK * hidden, gf.P), size=(1, TOPK), replace=False)
    y = rng.integers(0, gf.P, size=(1, TOPK))
    coeffs = gf.interpolate(x, y)
    return {
        "build 1 chunk": median_ms(lambda: build_proofs(one), repeats),
        "verify 1 chunk": median_ms(lambda: verify_proofs(one, one_proofs), repeats),
        "build 16 chunks / 16": median_ms(lambda: build_proofs(many), repeats) / 16,
        "verify 16 chunks / 16": median_ms(lambda: verify_proofs(many, many_proofs), repeats) / 16,
        "  gf.interpolate (k=128)": median_ms(lambda: gf.interpolate(x, y), repeats),
        "  gf.evaluate (k=128)": median_ms(lambda: gf.evaluate(coeffs, x), repeats),
    }


def bench_file(repeats: int) -> dict[str, float]:
    """Milliseconds per rollout file (64 sequences at hidden 128), batched and per sequence."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(24, 49, size=FILE_SEQUENCES)
    hidden = [
        torch.from_numpy(rng.standard_normal((int(n), FILE_HIDDEN))).to(torch.bfloat16)
        for n in lengths
    ]
    proofs = build_proofs_batch(hidden)
    assert proofs == [build_proofs(h) for h in hidden]
    chunks = sum(len(p) for p in proofs)
    figures = {
        "build, batched": median_ms(lambda: build_proofs_batch(hidden), repeats),
        "build, per sequence": median_ms(lambda: [build_proofs(h) for h in hidden], repeats),
        "verify, batched": median_ms(lambda: verify_proofs_batch(hidden, proofs), repeats),
        "verify, per sequence": median_ms(
            lambda: [verify_proofs(h, p) for h, p in zip(hidden, proofs, strict=True)], repeats
        ),
    }
    print(
        f"\nrollout file: {FILE_SEQUENCES} sequences of {lengths.min()}-{lengths.max()} tokens "
        f"at hidden {FILE_HIDDEN}, {chunks} chunks"
    )
    print(f"{'':26}{'ms per file':>14}{'us per chunk':>14}")
    for name, ms in figures.items():
        print(f"{name:26}{ms:14.2f}{ms / chunks * 1e3:14.1f}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per figure")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the worker's default is 1)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, chunk {CHUNK} "
        f"tokens, topk {TOPK}; median of {args.repeats} calls, ms per chunk"
    )
    results = {hidden: bench_hidden(hidden, args.repeats) for hidden in (128, 896, 4096)}
    print(f"{'':26}" + "".join(f"{f'hidden {h}':>14}" for h in results))
    for name in results[4096]:
        print(f"{name:26}" + "".join(f"{r[name]:14.3f}" for r in results.values()))
    total = results[4096]["build 1 chunk"] + results[4096]["verify 1 chunk"]
    verdict = "meets" if total <= TARGET_MS else "MISSES"
    print(
        f"build + verify, 1 chunk at hidden 4096: {total:.3f} ms "
        f"({verdict} the {TARGET_MS} ms target)"
    )
    bench_file(max(args.repeats // 10, 5))


if __name__ == "__main__":
    main()
