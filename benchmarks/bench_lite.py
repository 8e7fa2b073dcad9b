"""Loading and training a policy with `model/lite.py` against transformers' classes.

    python benchmarks/bench_lite.py            # the embedded model, 5 pairs of each
    python benchmarks/bench_lite.py --pairs 9 --model DIR

Two figures, each measured in pairs, one after the other (this machine is shared and
noisy, so the ratio of a pair is what counts):

- start: CPU-seconds of a fresh interpreter that imports what loads a policy and loads
  it, once through `checkpoints.load_policy` (torch, safetensors, tokenizers) and once
  through transformers' `AutoModelForCausalLM` and `AutoTokenizer` (what every worker,
  validator and evaluation process did at a run's start);
- train step: seconds of one rollout update of the trainer (`trainer.update.rollout_update`:
  old logprobs, GRPO loss, backward, AdamW) on a batch shaped like the default run's (128
  samples, 16 prompt and up to 40 completion tokens, two minibatches), one torch thread,
  both models loaded from the same directory and updated from the same weights.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOAD_LITE = "from swarmrl.checkpoints import load_policy; load_policy({path!r})"
LOAD_HF = (
    "import torch\n"
    "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
    "AutoTokenizer.from_pretrained({path!r})\n"
    "AutoModelForCausalLM.from_pretrained({path!r}, dtype=torch.float32).eval()"
)


def child_cpu_seconds(code: str) -> float:
    """CPU-seconds (user + system) of a fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _batch(n: int, seed: int):
    """The default run's step shape: n samples in groups, 16 prompt tokens, 28-40
    completion tokens, advantages of either sign."""
    import random

    from swarmrl.trainer.batches import token_samples

    rng = random.Random(seed)
    prompts = [[rng.randrange(4, 100) for _ in range(16)] for _ in range(n)]
    completions = [[rng.randrange(4, 100) for _ in range(rng.randrange(28, 41))] for _ in range(n)]
    return token_samples(prompts, completions, [rng.uniform(-1.5, 1.5) for _ in range(n)])


def train_step_seconds(model_dir: Path, pairs: int) -> tuple[list[float], list[float]]:
    """Seconds of one rollout update, lite then transformers, `pairs` times."""
    import torch
    from transformers import AutoModelForCausalLM

    from swarmrl.checkpoints import load_policy
    from swarmrl.trainer.distributed import Ranks
    from swarmrl.trainer.update import UpdateSettings, rollout_update

    torch.set_num_threads(1)
    models = {
        "lite": load_policy(model_dir)[0],
        "transformers": AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
    }
    optimizers = {
        name: torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.01)
        for name, m in models.items()
    }
    settings = UpdateSettings(
        temperature=1.0,
        max_new_tokens=40,
        epsilon=0.2,
        delta=4.0,
        entropy_coef=0.0,
        grad_clip=1.0,
        micro_batch_samples=None,
    )
    samples = _batch(128, 0)
    minibatches = [list(range(0, 128, 2)), list(range(1, 128, 2))]
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for rep in range(pairs + 1):  # the first pair warms up (optimizer state, allocator)
        for name, model in models.items():
            start = time.perf_counter()
            rollout_update(
                model, optimizers[name], samples, minibatches, [1e-4, 1e-4], settings, Ranks(), 0
            )
            if rep:
                seconds[name].append(time.perf_counter() - start)
    return seconds["lite"], seconds["transformers"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory (default: the embedded model)"
    )
    parser.add_argument("--pairs", type=int, default=5, help="pairs of each measurement")
    args = parser.parse_args()
    if args.model is None:
        from swarmrl.model.build import ensure_default_model

        args.model = ensure_default_model()
    path = str(Path(args.model).resolve())

    starts: dict[str, list[float]] = {"lite": [], "transformers": []}
    for _ in range(args.pairs):
        starts["lite"].append(child_cpu_seconds(LOAD_LITE.format(path=path)))
        starts["transformers"].append(child_cpu_seconds(LOAD_HF.format(path=path)))
    lite_steps, hf_steps = train_step_seconds(Path(path), args.pairs)

    def show(name: str, lite: list[float], hf: list[float], unit: str) -> None:
        ratios = [a / b for a, b in zip(lite, hf, strict=True)]
        print(
            f"{name:<11} lite {statistics.median(lite):.3f} {unit} [{min(lite):.3f}–{max(lite):.3f}]"
            f"   transformers {statistics.median(hf):.3f} {unit} [{min(hf):.3f}–{max(hf):.3f}]"
            f"   lite/transformers per pair: median {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}–{max(ratios):.2f}]"
        )

    print(f"model {path}, {args.pairs} pairs")
    show("start", starts["lite"], starts["transformers"], "CPU-s")
    show("train step", lite_steps, hf_steps, "s")


if __name__ == "__main__":
    main()
