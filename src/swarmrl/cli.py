"""The `swarmrl` command: one subcommand per role, plus `run` for a whole local swarm."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from swarmrl.config import ConfigError, add_config_arguments, config_from_args


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


def _trainer(args: argparse.Namespace) -> int:
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.protocol import PoolClient, PoolRefused
    from swarmrl.trainer.distributed import relaunch_under_torchrun
    from swarmrl.trainer.metrics import StepMetrics
    from swarmrl.trainer.trainer import Trainer

    cfg = config_from_args(args)
    relaunch_under_torchrun(cfg.trainer.ranks)
    try:
        client = PoolClient(args.orchestrator, load_identity(args.key))
        trainer = Trainer(cfg, Path(args.start_model), client, origin_url=args.origin_url)
    except (KeyFileError, PoolRefused) as exc:
        print(f"swarmrl trainer: {exc}", file=sys.stderr)
        return 1
    shown = {
        "step",
        "reward",
        "task_reward",
        "length_error",
        "grad_norm",
        "clip_ratio",
        "entropy",
        "staleness_mean",
        "wait_seconds",
    }

    def show(record: StepMetrics) -> None:
        print(json.dumps(record.model_dump(include=shown)), flush=True)

    trainer.run(on_step=show)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.inference.adversary import behaviour
    from swarmrl.inference.worker import run_worker
    from swarmrl.protocol import PoolRefused
    from swarmrl.protocol.membership import ejected
    from swarmrl.supervisor import EXIT_EJECTED

    cfg = config_from_args(args)
    # SIGTERM (a supervisor stopping it) unwinds like Ctrl-C: the proof process is shut
    # down and its semaphores released, instead of a killed parent leaving them behind.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        identity = load_identity(args.key)
        counts = run_worker(
            cfg,
            args.orchestrator,
            identity,
            args.workdir,
            behaviour(args.adversary, identity.address, args.copy_from),
        )
    except (KeyFileError, PoolRefused) as exc:
        if isinstance(exc, PoolRefused) and ejected(exc):
            print(f"swarmrl worker: ejected by the pool, stopping: {exc.detail}", file=sys.stderr)
            return EXIT_EJECTED
        print(f"swarmrl worker: {exc}", file=sys.stderr)
        return 1
    print(f"worker {identity.address}: {json.dumps(vars(counts))}", flush=True)
    return 0


def _validator(args: argparse.Namespace) -> int:
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.protocol import PoolClient, PoolRefused
    from swarmrl.validator.service import run_validator

    cfg = config_from_args(args)
    try:
        counts = run_validator(cfg, PoolClient(args.orchestrator, load_identity(args.key)))
    except (KeyFileError, PoolRefused) as exc:
        print(f"swarmrl validator: {exc}", file=sys.stderr)
        return 1
    print(f"validator: {json.dumps(counts)}", flush=True)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from swarmrl.evaluation import evaluate
    from swarmrl.tasks.registry import build_task

    cfg = config_from_args(args)
    print(json.dumps(evaluate(Path(args.model), build_task(cfg.task), cfg), indent=2))
    return 0


def _init_model(args: argparse.Namespace) -> int:
    from swarmrl.model.build import ensure_default_model

    def report(step: int, total: int, loss: float) -> None:
        if step % 50 == 0 or step == total:
            print(f"warm start step {step}/{total} loss {loss:.4f}", file=sys.stderr, flush=True)

    print(ensure_default_model(args.cache_dir, progress=report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from swarmrl.inference.kinds import KINDS

    parser = argparse.ArgumentParser(prog="swarmrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

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

    p = sub.add_parser(
        "trainer", help="run the GRPO trainer process of a run (resumes from its last checkpoint)"
    )
    add_config_arguments(p)
    p.add_argument(
        "--start-model",
        required=True,
        help="model directory to start from when the run has no checkpoint",
    )
    p.add_argument("--orchestrator", required=True, help="the orchestrator's URL")
    p.add_argument(
        "--key", type=Path, required=True, help="the trainer's key file (on the allowlist)"
    )
    p.add_argument(
        "--origin-url",
        required=True,
        help="URL of the trainer's SHARDCAST origin (serving <run>/shardcast/origin), "
        "announced to relays and workers",
    )
    p.set_defaults(func=_trainer)

    p = sub.add_parser(
        "worker",
        help="run one inference worker: take assignments from an orchestrator, upload rollouts",
        description="Register with the orchestrator as a worker, fetch its checkpoints through "
        "SHARDCAST, generate the assigned rollouts with their TOPLOC proofs and upload them; "
        "stops when the run is finished. The sampling and task options must match the run's.",
    )
    add_config_arguments(p)
    p.add_argument("--orchestrator", required=True, help="the orchestrator's URL")
    p.add_argument(
        "--key",
        type=Path,
        required=True,
        help="this worker's key file (`swarmrl keygen`); its address is the worker's identity",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        required=True,
        help="the worker's own folder: policy cache, outbox, stats.jsonl (never the run folder)",
    )
    p.add_argument(
        "--adversary",
        choices=list(KINDS),
        default=None,
        help="cheat in this way (to test a pool's defences; docs/adversaries.md)",
    )
    p.add_argument(
        "--copy-from",
        type=Path,
        default=None,
        help="with --adversary copy: a folder of other workers' rollout files to copy from",
    )
    p.set_defaults(func=_worker)

    p = sub.add_parser(
        "validator",
        help="run the validator of a pool: judge the files the orchestrator hands out",
        description="Register with the orchestrator as the validator, judge each file it hands "
        "out (its secret random fraction) with the claimed checkpoint fetched through SHARDCAST, "
        "post the signed verdict and append it to <run>/validator/verdicts.jsonl; stops when the "
        "run is finished (docs/validator.md).",
    )
    add_config_arguments(p)
    p.add_argument("--orchestrator", required=True, help="the orchestrator's URL")
    p.add_argument(
        "--key", type=Path, required=True, help="the validator's key file (on the allowlist)"
    )
    p.set_defaults(func=_validator)

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

    from swarmrl.identity.cli import register as register_keygen
    from swarmrl.orchestrator.cli import register as register_orchestrator
    from swarmrl.protocol.funding import register as register_funding
    from swarmrl.protocol.status import register as register_status
    from swarmrl.shardcast.cli import register as register_shardcast
    from swarmrl.tasks.cli import register as register_filter
    from swarmrl.validator.cli import register as register_validate

    register_validate(sub)
    register_shardcast(sub)
    register_keygen(sub)
    register_orchestrator(sub)
    register_status(sub)
    register_funding(sub)
    register_filter(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"swarmrl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
