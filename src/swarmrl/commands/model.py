"""`swarmrl eval` and `init-model`: a model directory's held-out score, and the embedded
default model built (or found) in the cache."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swarmrl.config import add_config_arguments, config_from_args


def _eval(args: argparse.Namespace) -> int:
    from swarmrl.evaluation import evaluate
    from swarmrl.tasks.registry import build_task

    cfg = config_from_args(args)
    result = evaluate(Path(args.model), build_task(cfg.task), cfg)
    print(json.dumps(result.model_dump(), indent=2))
    return 0


def _init_model(args: argparse.Namespace) -> int:
    from swarmrl.model.build import ensure_default_model

    def report(step: int, total: int, loss: float) -> None:
        if step % 50 == 0 or step == total:
            print(f"warm start step {step}/{total} loss {loss:.4f}", file=sys.stderr, flush=True)

    print(ensure_default_model(args.cache_dir, progress=report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="evaluate a model directory on the configured task's held-out split"
    )
    add_config_arguments(p)
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.set_defaults(func=_eval)

    p = sub.add_parser(
        "init-model", help="build (or find) the cached embedded default model and print its path"
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache folder (default $SWARMRL_CACHE or ~/.cache/swarmrl)",
    )
    p.set_defaults(func=_init_model)
