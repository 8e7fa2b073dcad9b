"""Benchmark: per-chunk cost of building and verifying TOPLOC proofs on this CPU.

Run: python benchmarks/bench_toploc.py [--repeats N]

For hidden sizes 896 (Qwen2.5-0.5B) and 4096 (7-8B models) it times, on one 32-token
chunk and on a 512-token sequence (16 chunks, the common batched call), the median
over repeats of ``build_proofs`` and ``verify_proofs``, reported per chunk. The
acceptance target is build + verify of one chunk at hidden 4096 within 2 ms. The
field arithmetic alone (one chunk's interpolation, one chunk's evaluation) is timed
too; the rest of a chunk's cost is mostly the top-k selection, which grows with the
hidden size.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from swarmrl.toploc import build_proofs, gf, verify_proofs

CHUNK = 32
TOPK = 128
TARGET_MS = 2.0


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
    x = rng.choice(gf.P, size=(1, TOPK), replace=False)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per figure")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, chunk {CHUNK} "
          f"tokens, topk {TOPK}; median of {args.repeats} calls, ms per chunk")
    results = {hidden: bench_hidden(hidden, args.repeats) for hidden in (896, 4096)}
    print(f"{'':26}" + "".join(f"{f'hidden {h}':>14}" for h in results))
    for name in results[896]:
        print(f"{name:26}" + "".join(f"{r[name]:14.3f}" for r in results.values()))
    total = results[4096]["build 1 chunk"] + results[4096]["verify 1 chunk"]
    verdict = "meets" if total <= TARGET_MS else "MISSES"
    print(f"build + verify, 1 chunk at hidden 4096: {total:.3f} ms "
          f"({verdict} the {TARGET_MS} ms target)")


if __name__ == "__main__":
    main()
