"""Benchmark: honest replay drift at scale: how far the validator's view of each sampled
token moves from the worker's, and whether any honest sample is rejected.

Run: nice -n 10 python benchmarks/bench_replay_drift.py [--samples N] [--families embedded,gpt2]
     [--threads 1,2] [--batches 1,4,16] [--out drift.jsonl]

What it does, per model family:

- ``embedded``: the embedded model `swarmrl run` trains (the cached default warm start);
  ``gpt2`` / ``qwen2``: a random GPT-2 / Qwen2 directory of the same size, built here
  with the embedded model's tokenizer (nothing is downloaded). GPT-2 runs on the generic
  Hugging Face path (worker and validator), Llama and Qwen2 on the fast decoder.
  The random models use ``initializer_range`` 0.1: the default 0.02 gives almost
  uniform next-token distributions, which hide rounding in a flat CDF.
- Honest workers: the real sampling path (``generate_rollouts``: the batched sampler,
  rewards, TOPLOC proofs), at every worker thread count in ``--threads`` and every
  batch composition in ``--batches`` (files generated in one sampler call: the row
  count, the prompts' padding and the order rows leave the batch all change the
  shapes of the matrix products, hence their rounding), each file an offline
  assignment of the default run config (8 prompts x 8 samples, <= 48 tokens, T = 0.6).
- Each file is written to Parquet and judged from disk by the validator process's own
  ``judge_file`` (strict read, every check: assignment, values, termination, TOPLOC,
  logprobs, replay, statistical tests) once at every validator thread count.
- Drift is measured per token, not only through the verdict: the sampler's ``draw`` is
  wrapped to record the CDF interval of each drawn token under the worker's own
  logits (the validator's ``_distribution_stats`` applied to them), and the
  validator's ``recompute`` is wrapped to keep its intervals, so every token reports
  |worker bound - validator bound|. The verdict's replay excess (how far the seed's
  uniform lies outside the validator's interval) only turns positive when that drift
  straddles the uniform; the bound drift shows the margin on every token.

Output: one JSON line per (family, worker threads, files per call, validator threads)
cell with samples, tokens, verdicts, and the worst of each figure, written to
``--out`` after each round; then ``drift_report.py``'s tables: counts per family and
thread count, each worst honest figure against the validator's default threshold, and
the candidate replay policies. Cost: about
the worker's generation time plus one validation per validator thread count.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import swarmrl.generation.sampler as sampler_module
import swarmrl.validator.prefill as prefill_module
import swarmrl.validator.verdict as verdict_module
from drift_report import report
from swarmrl.assignment import Assignment, assign
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.model.build import ensure_default_model
from swarmrl.model.tokenizer import build_char_tokenizer
from swarmrl.rollouts import RolloutMeta, SeenFiles, write_rollouts
from swarmrl.tasks.registry import build_task
from swarmrl.validator import ValidatorSettings, judge_file
from swarmrl.validator.prefill import TokenStats
from swarmrl.validator.sampling import sample_uniforms

FAMILIES = ("embedded", "gpt2", "qwen2")
ADDRESS = "0xdrift"


def family_dir(family: str, root: Path) -> Path:
    """The model directory of a family: the embedded model, or a random one built once."""
    if family == "embedded":
        return ensure_default_model()
    dest = root / f"random-{family}"
    if (dest / "config.json").exists():
        return dest
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    ids = {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "initializer_range": 0.1,
    }
    torch.manual_seed(0)
    if family == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=128, n_layer=4, n_head=4, n_positions=256, **ids))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(
            Qwen2Config(
                hidden_size=128,
                intermediate_size=512,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
                **ids,
            )
        )
    else:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    tmp = dest.with_name(dest.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(dest)
    return dest


# Candidate replay policies (tolerance, slack below the floor), the floor fixed at the
# default: the expected and the realized honest misses are counted for each.
POLICIES = tuple(
    (t, f)
    for t in (1e-6, 3e-6, 1e-5, 2e-5, 3e-5, 1e-4)
    for f in dict.fromkeys((0.0, 1e-7, 1e-6, t))
    if f <= t
)


def policy_name(tolerance: float, floor_tolerance: float) -> str:
    return f"{tolerance:g}/{floor_tolerance:g}"


def cdf_rows(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """Per row, the normalized CDF in the sampler's inverse-CDF order (vocabulary order;
    top_p = 1), computed as ``draw`` and ``_distribution_stats`` compute it."""
    probs = torch.log_softmax(logits.float() / temperature, dim=-1).exp().double()
    cdf = probs.cumsum(-1)
    return (cdf / cdf[:, -1:]).numpy()


def miss_probability(
    worker: np.ndarray,
    validator: np.ndarray,
    tolerance: float,
    floor: float,
    floor_tolerance: float,
) -> np.ndarray:
    """Per position, the probability that an honest draw (u uniform) is a replay miss.

    The worker draws token x when u lies in its interval [W_{x-1}, W_x); the validator
    passes it when u lies in [V_{x-1} - s, V_x + s], s = ``tolerance`` (``floor_tolerance``
    for a token less likely than ``floor``). The miss probability is the part of the
    worker's intervals outside the validator's, summed over the vocabulary.
    """
    zeros = np.zeros((len(worker), 1))
    w_low, w_high = np.hstack([zeros, worker[:, :-1]]), worker
    v_low, v_high = np.hstack([zeros, validator[:, :-1]]), validator
    slack = np.where(v_high - v_low >= floor, tolerance, floor_tolerance)
    inside = np.clip(
        np.minimum(w_high, v_high + slack) - np.maximum(w_low, v_low - slack), 0.0, None
    )
    return np.clip((w_high - w_low) - inside, 0.0, None).sum(-1)


@dataclass
class WorkerCdfs:
    """The CDF under the worker's own logits of every token the wrapped sampler drew,
    keyed by its uniform (a 53-bit value unique to its (seed, position))."""

    temperature: float
    by_uniform: dict[float, np.ndarray] = field(default_factory=dict)

    def wrap(self, draw: Callable) -> Callable:
        def recording_draw(logits, u, temperature, top_p):
            for key, row in zip(u.tolist(), cdf_rows(logits, temperature), strict=True):
                self.by_uniform[key] = row
            return draw(logits, u, temperature, top_p)

        return recording_draw


@dataclass
class Cell:
    """One (family, worker threads, files per call, validator threads) combination."""

    family: str
    worker_threads: int
    files_per_call: int
    validator_threads: int
    files: int = 0
    samples: int = 0
    tokens: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    max_bound_drift: float = 0.0  # |worker - validator| over every CDF boundary of every position
    max_drawn_bound_drift: float = 0.0  # the same, the drawn token's two interval ends only
    max_replay_excess: float = -1.0  # how far a uniform lay outside the validator's interval
    max_logprob_diff: float = 0.0
    max_exp_mismatches: int = 0
    max_mant_err_mean: float = 0.0
    max_mant_err_median: float = 0.0
    min_pit_p: float = 1.0
    max_abs_z: float = 0.0
    # Per candidate policy: expected honest replay misses over the cell's tokens, and
    # the samples the real replay check would reject.
    expected_misses: dict[str, float] = field(
        default_factory=lambda: {policy_name(*p): 0.0 for p in POLICIES}
    )
    rejected_samples: dict[str, int] = field(
        default_factory=lambda: {policy_name(*p): 0 for p in POLICIES}
    )
    validate_seconds: float = 0.0

    def add(self, verdict, stats, validator_cdf, tokens, seeds, worker: WorkerCdfs, floor: float):
        self.files += 1
        self.verdicts[verdict.status.value] = self.verdicts.get(verdict.status.value, 0) + 1
        if verdict.status != "accepted" and len(self.reasons) < 5:
            self.reasons.append(verdict.reason)
        f = verdict.figures
        self.samples += f.get("samples", 0)
        self.tokens += f.get("completion_tokens", 0)
        if "logprobs.max_abs_diff" in f:
            self.max_logprob_diff = max(self.max_logprob_diff, f["logprobs.max_abs_diff"])
            self.max_exp_mismatches = max(
                self.max_exp_mismatches, int(f["toploc.max_exp_mismatches"])
            )
            self.max_mant_err_mean = max(self.max_mant_err_mean, f["toploc.max_mant_err_mean"])
            self.max_mant_err_median = max(
                self.max_mant_err_median, f["toploc.max_mant_err_median"]
            )
            self.min_pit_p = min(self.min_pit_p, f["sampling.pit_p"])
            self.max_abs_z = max(self.max_abs_z, abs(f["sampling.surprisal_z"]))
            self.max_replay_excess = max(self.max_replay_excess, f["sampling.max_replay_excess"])
        if not stats:
            return
        uniforms = np.concatenate(
            [sample_uniforms(seed, len(s.cdf_low)) for s, seed in zip(stats, seeds, strict=True)]
        )
        w = np.stack([worker.by_uniform[key] for key in uniforms.tolist()])
        v = validator_cdf
        self.max_bound_drift = max(self.max_bound_drift, float(np.abs(w - v).max()))
        low = np.concatenate([s.cdf_low for s in stats])
        high = np.concatenate([s.cdf_high for s in stats])
        rows = np.arange(len(w))
        # The validator's bounds of the drawn token against the worker's own.
        drawn = np.asarray(tokens)
        w_high = w[rows, drawn]
        w_low = np.where(drawn > 0, w[rows, np.maximum(drawn - 1, 0)], 0.0)
        self.max_drawn_bound_drift = max(
            self.max_drawn_bound_drift,
            float(np.maximum(np.abs(w_high - high), np.abs(w_low - low)).max()),
        )
        # The replay check's rule (sampling.replay) for every policy at once, per token.
        excess = np.maximum(low - uniforms, uniforms - high)
        likely = np.concatenate([s.prob for s in stats]) >= floor
        starts = np.cumsum([0] + [len(s.cdf_low) for s in stats[:-1]])
        for t, f in POLICIES:
            name = policy_name(t, f)
            self.expected_misses[name] += float(miss_probability(w, v, t, floor, f).sum())
            missed = (excess > np.where(likely, t, f)).astype(np.int64)
            self.rejected_samples[name] += int((np.add.reduceat(missed, starts) > 0).sum())

    def row(self) -> dict:
        return dict(self.__dict__)


def merged(plans: list[Assignment]) -> Assignment:
    """Several assignments as one sampler call (the rows of each, in order)."""

    def cat(name):
        return functools.reduce(operator.iadd, (list(getattr(p, name)) for p in plans), [])

    return Assignment(
        seed=0,
        problem_indices=cat("problem_indices"),
        target_lengths=cat("target_lengths"),
        sample_seeds=cat("sample_seeds"),
    )


def run_family(
    family: str,
    model_dir: Path,
    args: argparse.Namespace,
    counter_start: int,
    deadline: float,
) -> list[Cell]:
    """Generate and judge honest files of one family until ``args.samples`` or the deadline."""
    model, tok = load_policy(model_dir)
    cfg = load_config(None, {"run_name": "drift"})
    task = build_task(cfg.task)
    settings = ValidatorSettings()
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    if params.top_p < 1.0:
        raise SystemExit("the drift measurement follows the sampler's order for top_p = 1 only")
    per_file = cfg.worker.prompts_per_file * cfg.sampling.group_size
    group = cfg.sampling.group_size
    worker = WorkerCdfs(params.temperature)
    kept_stats: list[list[TokenStats]] = []
    kept_logits: list[torch.Tensor] = []
    real_draw = sampler_module.draw
    real_recompute, real_stats = verdict_module.recompute, prefill_module._distribution_stats

    def keeping_recompute(*a, **kw):
        kept_stats.append(real_recompute(*a, **kw))
        return kept_stats[-1]

    def keeping_stats(logits, *a, **kw):
        kept_logits.append(logits.detach().clone())
        return real_stats(logits, *a, **kw)

    # Instrumentation only: each wrapper calls the real function and returns its answer.
    sampler_module.draw = worker.wrap(real_draw)  # type: ignore[assignment]
    verdict_module.recompute = keeping_recompute  # type: ignore[assignment]
    prefill_module._distribution_stats = keeping_stats  # type: ignore[assignment]
    threads, batches = args.threads, args.batches
    cells = {(w, k, v): Cell(family, w, k, v) for w in threads for k in batches for v in threads}
    counter, done, start = counter_start, 0, time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            while done < args.samples and time.time() < deadline:
                for w in threads:
                    for k in batches:
                        torch.set_num_threads(w)
                        plans = [
                            assign(
                                cfg.seed,
                                ADDRESS,
                                0,
                                counter + i,
                                num_problems=task.num_train(),
                                prompts=cfg.worker.prompts_per_file,
                                group_size=group,
                                target_lengths=cfg.task.target_lengths,
                            )
                            for i in range(k)
                        ]
                        worker.by_uniform.clear()
                        cols = generate_rollouts(
                            model, tok, task, merged(plans), params, 0, cfg.task.length_alpha
                        ).columns
                        for i in range(k):
                            n = counter + i
                            part = {
                                name: values[i * per_file : (i + 1) * per_file]
                                for name, values in cols.items()
                            }
                            meta = RolloutMeta(
                                run_id=cfg.run_name,
                                worker_address=ADDRESS,
                                step=0,
                                submission=n,
                                num_samples=per_file,
                                num_nonzero=sum(
                                    group
                                    for j in range(0, per_file, group)
                                    if np.ptp(part["rewards"][j : j + group]) > 0
                                ),
                            )
                            path = write_rollouts(Path(tmp) / f"{n}.parquet", part, meta)
                            # Every file at every validator thread count, or (--alternate) at
                            # one of them in turn; the order alternates file by file.
                            order = threads if n % 2 else threads[::-1]
                            judges = [threads[n % len(threads)]] if args.alternate else order
                            for v in judges:
                                torch.set_num_threads(v)
                                kept_stats.clear()
                                kept_logits.clear()
                                t0 = time.perf_counter()
                                verdict = judge_file(
                                    path,
                                    cfg,
                                    lambda _step: (model, tok),
                                    settings,
                                    SeenFiles(),
                                    task,
                                )
                                cell = cells[(w, k, v)]
                                cell.validate_seconds += time.perf_counter() - t0
                                cell.add(
                                    verdict,
                                    kept_stats[0] if kept_stats else [],
                                    cdf_rows(torch.cat(kept_logits), params.temperature)
                                    if kept_logits
                                    else None,
                                    [t for out in part["output_tokens"] for t in out],
                                    part["seed"],
                                    worker,
                                    settings.replay_floor,
                                )
                            path.unlink()
                        counter += k
                        done += k * per_file
                elapsed = time.perf_counter() - start
                print(
                    f"{family}: {done} samples in {elapsed:.0f} s ({done / elapsed:.1f} samples/s)",
                    flush=True,
                )
                if args.out is not None:
                    write_cells(args.out, family, list(cells.values()))
    finally:
        sampler_module.draw = real_draw  # type: ignore[assignment]
        verdict_module.recompute = real_recompute  # type: ignore[assignment]
        prefill_module._distribution_stats = real_stats  # type: ignore[assignment]
        torch.set_num_threads(1)
    return list(cells.values())


def write_cells(out: Path, family: str, cells: list[Cell]) -> None:
    """The family's cells so far as JSON lines in ``<out>.<family>.jsonl`` (replaced whole)."""
    path = out.with_name(f"{out.name}.{family}.jsonl")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(c.row()) + "\n" for c in cells))
    tmp.rename(path)


def _ints(text: str) -> list[int]:
    values = [int(part) for part in text.split(",")]
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"distinct positive integers, e.g. 1,2: {text!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--samples", type=int, default=2048, help="honest samples per family (at least)"
    )
    parser.add_argument(
        "--families",
        default="embedded,gpt2",
        help=f"comma-separated, from {', '.join(FAMILIES)} [default: embedded,gpt2]",
    )
    parser.add_argument(
        "--threads",
        type=_ints,
        default=[1, 2],
        help="torch thread counts of workers and validators (every pair is run)",
    )
    parser.add_argument(
        "--batches",
        type=_ints,
        default=[1, 4, 16],
        help="files per sampler call (batch compositions) [default: 1,4,16]",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write each family's cells to <OUT>.<family>.jsonl after every round",
    )
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="judge each file at one validator thread count, in turn (half the validation "
        "cost); default: at every thread count",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=float("inf"),
        help="stop starting new rounds after this long (all families together)",
    )
    parser.add_argument(
        "--models",
        type=Path,
        default=Path(tempfile.gettempdir()) / "swarmrl-drift-models",
        help="where the random model directories are built",
    )
    args = parser.parse_args()
    args.models.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.max_seconds
    cells: list[Cell] = []
    for n, family in enumerate(args.families.split(",")):
        cells += run_family(family, family_dir(family, args.models), args, 10**6 * n, deadline)
    # The same report as drift_report.py gives from the written cells.
    print(json.dumps(report([c.row() for c in cells])))


if __name__ == "__main__":
    main()
