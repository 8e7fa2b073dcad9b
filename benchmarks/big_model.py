"""Build the ≥100M-parameter model the big-model benchmarks use, locally (nothing downloaded).

A 113 M-parameter `LlamaForCausalLM` (hidden 768, 12 layers, 12 heads, the character
tokenizer) warm-started by the embedded model's own recipe (`swarmrl.model.build`:
supervised steps on the arithmetic task's imperfect demonstrations), only shorter: a
model with random weights never draws EOS, every completion runs to the length limit,
all of a group's rewards tie and the trainer has no sample with an advantage. After
80 steps (about 3 minutes on 2 cores) it writes the task's format and stops.

    python benchmarks/big_model.py DIR [--steps 80]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from swarmrl.model.build import WarmStartRecipe, build_default_model

BIG = WarmStartRecipe(
    hidden_size=768, layers=12, heads=12, steps=80, batch_size=16, lr=5e-4, warmup=10
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dest", type=Path, help="model directory to write")
    parser.add_argument("--steps", type=int, default=BIG.steps, help="warm-start steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = WarmStartRecipe(**{**BIG.__dict__, "steps": args.steps})
    start = time.perf_counter()

    def progress(step: int, steps: int, loss: float) -> None:
        if step % 10 == 0 or step == steps:
            print(
                f"warm-start {step}/{steps}: loss {loss:.3f} ({time.perf_counter() - start:.0f} s)"
            )

    build_default_model(args.dest, recipe, progress)
    print(f"wrote {args.dest} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
