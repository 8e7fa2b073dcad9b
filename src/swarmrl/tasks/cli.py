"""The `swarmrl filter` subcommand: measure each training prompt's pass rate with a
model and write the prompts in a pass-rate band as a problem file (filtering.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from swarmrl.config import add_config_arguments, config_from_args

DEFAULT_SAMPLES = 8
DEFAULT_BAND = (0.1, 0.8)


def _filter(args: argparse.Namespace) -> int:
    from rich.console import Console

    from swarmrl.tasks import filtering

    console = Console(stderr=True)

    def fail(message: str, code: int = 2) -> int:
        print(f"swarmrl filter: {message}", file=sys.stderr)
        return code

    cfg = config_from_args(args)
    low, high = args.band
    try:
        filtering.check_band(low, high)
    except ValueError as exc:
        return fail(str(exc))
    if args.samples < 1:
        return fail(f"--samples {args.samples}: sample each prompt at least once")
    if args.limit is not None and args.limit < 1:
        return fail(f"--limit {args.limit}: consider at least one prompt")
    out: Path = args.out
    if out.suffix.lower() not in filtering.SUFFIXES:
        return fail(f"--out {out}: the file name must end in .jsonl or .parquet")
    inputs = [Path(p).resolve() for p in (cfg.task.path, cfg.task.eval_path) if p]
    if out.resolve() in inputs:
        return fail(f"--out {out} is one of the task's own problem files; write somewhere else")

    from swarmrl.tasks.loading import ProblemFileError
    from swarmrl.tasks.registry import build_task

    try:
        task = build_task(cfg.task)
    except (OSError, ProblemFileError, ValueError) as exc:
        return fail(str(exc))
    num_train = task.num_train()
    if args.limit is None and task.name == "arithmetic" and cfg.task.path is None:
        return fail(
            f"the arithmetic task has {num_train:,} training problems (hours of sampling); "
            "give --limit N, e.g. --limit 4096"
        )

    from swarmrl.run import SwarmError, resolve_start_model

    if args.model is not None:
        cfg.model.path = str(args.model)
    try:
        model_dir = resolve_start_model(cfg, console)
    except SwarmError as exc:
        return fail(str(exc).replace("model.path", "--model", 1))

    import torch

    from swarmrl.checkpoints import load_policy
    from swarmrl.generation.sampler import SamplingParams

    # The filter samples as a worker does; on a shared CPU a second torch thread mostly
    # spins against the other processes (measured 10x slower under load).
    torch.set_num_threads(cfg.worker.threads)
    model, tok = load_policy(model_dir)
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    indices = filtering.choose_prompts(num_train, args.limit, cfg.seed)
    console.print(
        f"filter: {len(indices):,} of {num_train:,} training prompts of task {task.name} "
        f"x {args.samples} samples with {model_dir}; keeping pass rates in [{low}, {high}] "
        f"(passes {_span(filtering.kept_pass_counts(args.samples, low, high))} of {args.samples})",
        soft_wrap=True,
    )
    started = time.monotonic()
    with _Progress(console, len(indices)) as advance:
        results = filtering.measure_pass_rates(
            model,
            tok,
            task,
            indices,
            samples=args.samples,
            params=params,
            target_lengths=cfg.task.target_lengths,
            seed=cfg.seed,
            progress=advance,
        )
    seconds = time.monotonic() - started
    kept = filtering.keep_band(results, low, high)
    histogram = filtering.pass_histogram(results, args.samples)
    if not kept:
        return fail(
            f"no prompt's pass rate lies in [{low}, {high}] (prompts by passes 0..{args.samples}: "
            f"{histogram}); widen --band, raise --samples or --limit, or use another --model; "
            "nothing was written",
            1,
        )
    filtering.write_problem_file(out, [filtering.pass_rate_row(task, r) for r in kept])
    use = ["--task.name", task.name, "--task.path", str(out)]
    held_out_file = None
    if task.name != "arithmetic":
        # The filtered file has no held-out tail of its own: keep the task's split as is.
        if cfg.task.eval_path:
            use += ["--task.eval_path", cfg.task.eval_path]
        else:
            held_out_file = out.with_name(f"{out.stem}.heldout{out.suffix}")
            filtering.write_problem_file(
                held_out_file, [filtering.problem_row(task, p) for p in task.eval_problems()]
            )
            use += ["--task.eval_path", str(held_out_file)]
    summary = {
        "model": str(model_dir),
        "task": task.name,
        "prompts": len(results),
        "samples_per_prompt": args.samples,
        "samples_generated": len(results) * args.samples,
        "band": [low, high],
        "kept": len(kept),
        "kept_fraction": len(kept) / len(results),
        "prompts_by_passes": histogram,
        "mean_pass_rate_all": filtering.mean_rate(results),
        "mean_pass_rate_kept": filtering.mean_rate(kept),
        "seconds": round(seconds, 1),
        "out": str(out),
        "held_out_file": None if held_out_file is None else str(held_out_file),
        "train_with": " ".join(use),
    }
    print(json.dumps(summary, indent=2))
    console.print(
        f"kept {len(kept):,} of {len(results):,} prompts -> {out}; train on them with "
        f"`swarmrl run {' '.join(use)}`",
        soft_wrap=True,
    )
    return 0


def _span(counts: list[int]) -> str:
    if not counts:
        return "none"
    if counts == list(range(counts[0], counts[-1] + 1)):
        return f"{counts[0]}-{counts[-1]}" if len(counts) > 1 else str(counts[0])
    return ",".join(map(str, counts))


class _Progress:
    """A bar with count, elapsed and remaining time in a terminal; else a line every 30 s."""

    def __init__(self, console, total: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console, self.total = console, total
        self.bar = Progress(
            TextColumn("sampling prompts"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("filter", total=total)
        self.started = self.last_line = time.monotonic()

    def __enter__(self):
        if self.console.is_terminal:
            self.bar.start()
        return self.advance

    def __exit__(self, *exc) -> None:
        if self.console.is_terminal:
            self.bar.stop()

    def advance(self, done: int, total: int) -> None:
        if self.console.is_terminal:
            self.bar.update(self.task, completed=done, total=total)
            return
        now = time.monotonic()
        if now - self.last_line >= 30 or done == total:
            rate = done / max(now - self.started, 1e-9)
            left = (total - done) / rate if rate > 0 else float("nan")
            self.console.print(f"sampled {done}/{total} prompts, ETA {left:.0f} s", soft_wrap=True)
            self.last_line = now


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "filter",
        help="keep the training prompts a model solves at a pass rate in a band (offline filter)",
        description="Sample K completions of each training prompt of the configured task with a "
        "model at the run's sampling settings, score them with the task's verifier and write the "
        "prompts whose pass rate lies in the band, with their pass rates, as a problem file the "
        "task reads (--task.path). The held-out split is never sampled. It samples with "
        "worker.threads torch threads, as a worker does (docs/tasks.md).",
    )
    add_config_arguments(p)
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="Hugging Face causal LM directory to measure pass rates with "
        "(default: model.path, else the embedded model)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        metavar="K",
        help=f"completions per prompt; pass rates are multiples of 1/K [default: {DEFAULT_SAMPLES}]",
    )
    p.add_argument(
        "--band",
        type=float,
        nargs=2,
        default=list(DEFAULT_BAND),
        metavar=("LOW", "HIGH"),
        help="keep prompts with LOW <= pass rate <= HIGH [default: 0.1 0.8, the paper's: with "
        "K = 8 it keeps prompts solved 1-6 times]",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="consider a seeded random N of the training prompts (--seed) [default: all; "
        "required for the arithmetic task without task.path]",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the filtered prompt set to write (.jsonl or .parquet); for math and code "
        "without task.eval_path the held-out split is copied beside it as <name>.heldout.<ext>",
    )
    p.set_defaults(func=_filter)
