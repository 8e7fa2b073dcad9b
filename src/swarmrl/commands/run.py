"""`swarmrl run`: the whole pool on this machine, trained and evaluated (`swarmrl.run`)."""

from __future__ import annotations

import argparse
import sys

from swarmrl.config import add_config_arguments, config_from_args


def _run(args: argparse.Namespace) -> int:
    from swarmrl.inference.kinds import parse_kinds
    from swarmrl.run import RunInterrupted, SwarmError, run_swarm

    cfg = config_from_args(args)
    try:
        adversaries = parse_kinds(args.adversary) if args.adversary is not None else []
    except ValueError as exc:
        print(f"swarmrl run: --adversary: {exc}", file=sys.stderr)
        return 2
    try:
        run_swarm(cfg, fresh=args.fresh, adversaries=adversaries)
    except SwarmError as exc:
        print(f"swarmrl run failed: {exc}", file=sys.stderr)
        return 1
    except RunInterrupted as exc:
        print(f"swarmrl run {exc}", file=sys.stderr)
        return 128 + exc.signum
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from swarmrl.inference.kinds import KINDS

    p = sub.add_parser(
        "run",
        help="train the configured model with a local swarm (trainer + workers) and evaluate it",
        description="Start a trainer, N inference workers, SHARDCAST relays and a validator on this machine, "
        "train with asynchronous GRPO, "
        "evaluate the starting and final checkpoints, write <output_dir>/<run_name>/summary.json. "
        "Every option below is a config field; --config reads them from a TOML file.",
    )
    add_config_arguments(p)
    p.add_argument(
        "--fresh",
        action="store_true",
        help="delete the run folder <output_dir>/<run_name> first and start over "
        "(without it, a run folder is resumed if its start model, task and recipe match)",
    )
    p.add_argument(
        "--adversary",
        metavar="KIND[,KIND...]",
        default=None,
        help="also start one cheating worker per kind, to watch the pool catch, slash and "
        f"eject it (docs/adversaries.md); kinds: {', '.join(KINDS)}",
    )
    p.set_defaults(func=_run)
