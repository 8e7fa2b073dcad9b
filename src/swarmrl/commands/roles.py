"""`swarmrl trainer`, `worker` and `validator`: one role's process of a pool, joined
with its key; every config field is a flag (the run's own command lines start these)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.config import add_config_arguments, config_from_args

if TYPE_CHECKING:
    from swarmrl.inference.finisher import FinishProcess


def _trainer(args: argparse.Namespace) -> int:
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.protocol import PoolClient, PoolRefused
    from swarmrl.trainer.distributed import exit_rank, relaunch_under_torchrun
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
    if trainer.ranks.sharded:
        exit_rank(0)  # not through the interpreter's shutdown (see exit_rank)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from swarmrl.inference.finisher import FinishProcess

    # SIGTERM (a supervisor stopping it) unwinds like Ctrl-C: the proof process is shut
    # down and its semaphores released, instead of a killed parent leaving them behind.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    # The proof process first: its start (seconds of imports) runs beside this process's
    # imports below, not after the first file is generated.
    proof_process = FinishProcess()
    try:
        return _serve_as_worker(args, proof_process)
    finally:
        proof_process.close()


def _serve_as_worker(args: argparse.Namespace, proof_process: FinishProcess) -> int:
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.inference.adversary import behaviour
    from swarmrl.inference.worker import run_worker
    from swarmrl.protocol import PoolRefused
    from swarmrl.protocol.membership import ejected
    from swarmrl.supervisor import EXIT_EJECTED

    cfg = config_from_args(args)
    try:
        identity = load_identity(args.key)
        counts = run_worker(
            cfg,
            args.orchestrator,
            identity,
            args.workdir,
            behaviour(args.adversary, identity.address, args.copy_from),
            proof_process=proof_process,
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


def register(sub: argparse._SubParsersAction) -> None:
    from swarmrl.inference.kinds import KINDS

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
