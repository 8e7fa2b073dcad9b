"""`swarmrl run`: a whole pool on one machine, from warm start to held-out evaluation.

Starts, on loopback, the orchestrator (SQLite ledger, rollout store, secret and
allowlist in `<run>/orchestrator/`), the trainer with its SHARDCAST origin (served from
this process), a chain of relays, N inference workers and a validator, as separate
processes that meet only through the orchestrator: workers register, heartbeat, take
assignments, fetch checkpoints from the relays and upload their rollout files; the
trainer downloads a step's files and announces each checkpoint; the validator judges
the files the orchestrator hands it (a secret random fraction). Each trusted role has a
key in `<run>/keys/`; each worker has its own folder (key, policy cache, outbox) beside
the run folder, `<output_dir>/<run_name>.workers/worker-<i>/`, and never touches the
run folder. All processes start at once (each registers once the orchestrator answers,
a worker once the run has funded its stake); the starting model is evaluated on the
held-out split meanwhile, and the final checkpoint at the end. Then writes
`<output_dir>/<run_name>/summary.json`: accuracy, the samples workers uploaded against
those the trainer read, the bytes each server served, the validator's verdict counts,
the ledger's consistency and the restarts of each process.

- `--adversary KIND[,KIND...]` adds one cheating worker per kind
  (`inference/adversary.py`), in its own folder `adversary-<kind>/` beside the honest
  workers'. The console shows each slashing the orchestrator records (who, when, the
  check that failed, the stake slashed, the files voided and tainted), and the summary
  lists every cheater: caught or not, and ejected or not. An ejected worker exits with
  `EXIT_EJECTED` and is not restarted.

- One run, one folder: a run folder is resumed only by a run with the same start model,
  task and recipe (`config.run_differences`); anything else is refused with what
  differs, and `--fresh` (or another `--run_name`) starts over. Keys are reused on resume.
- Supervision (`supervisor.py`): a process that dies is restarted with backoff and
  resumes (the orchestrator from its ledger on the same port, the trainer from its last
  checkpoint, the relay and validator from their folders, a worker from its folder); one
  that keeps dying ends the run with its log tail.
- SIGINT / SIGTERM stop every process of the run (a second signal kills them at once)
  and say how to resume.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from rich.console import Console

from swarmrl.config import RunConfig
from swarmrl.display import StepDisplay, counted
from swarmrl.identity import load_identity
from swarmrl.protocol import PoolClient, PoolRefused, PoolUnreachable
from swarmrl.protocol.funding import fund_workers, owner_key
from swarmrl.run.launch import (
    check_model_dir,
    free_port,
    orchestrator_role,
    pool_roles,
    prepare_folder,
    prepare_pool,
    resolve_start_model,
)
from swarmrl.run.summary import (
    RunSummary,
    cheaters_summary,
    ledger_figures,
    proof_figures,
    worker_accounts,
)
from swarmrl.run.watch import SlashingWatch, supervise, wait_for_orchestrator
from swarmrl.runfolder import checkpoint_dir, latest_checkpoint
from swarmrl.shardcast.client import server_bytes
from swarmrl.supervisor import Supervisor
from swarmrl.tasks.registry import build_task
from swarmrl.trainer.metrics import dashboard_report, read_metrics
from swarmrl.trainer.sinks import open_mlflow

EVAL_BATCH = 64  # problems per evaluation batch: the bar's count advances per batch


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run; the message says what is left and how to resume."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def run_swarm(
    cfg: RunConfig,
    console: Console | None = None,
    fresh: bool = False,
    adversaries: Sequence[str] = (),
) -> RunSummary:
    """Run the whole swarm and return the summary; `adversaries`: kinds of cheating
    worker to add (`inference/adversary.py`). Raises SwarmError (a process kept failing,
    or the run folder holds another run) or RunInterrupted (SIGINT/SIGTERM)."""
    console = console or Console(stderr=True, soft_wrap=True)  # log lines stay unwrapped
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a console line per request
    supervisor: list[Supervisor] = []
    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        for sup in supervisor:
            if sup.spawning:
                sup.deferred_signal = signum
                return
        signals.append(signum)
        if len(signals) == 1 and not any(sup.stopping for sup in supervisor):
            raise RunInterrupted(signal.Signals(signum).name, signum)
        # A second signal, or one during the shutdown: no more grace for anyone.
        for sup in supervisor:
            sup.kill_all()
        os.write(2, b"second signal: killed every process of the run at once\n")
        os._exit(128 + signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(cfg, console, fresh, supervisor, list(adversaries))
    except RunInterrupted as exc:
        step = latest_checkpoint(cfg.folder.checkpoints)
        left = (
            f"checkpoints up to step {step}/{cfg.trainer.steps} are kept in {cfg.folder.checkpoints}; "
            "run the same command again to resume"
            if step is not None
            else "nothing was trained yet"
        )
        raise RunInterrupted(
            f"stopped by {exc}: every process of the run has exited; {left}", exc.signum
        ) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(
    cfg: RunConfig,
    console: Console,
    fresh: bool,
    supervisor: list[Supervisor],
    adversaries: list[str],
) -> RunSummary:
    started = time.time()
    folder = cfg.folder
    resume_step = prepare_folder(cfg, fresh, console)
    start_model = resolve_start_model(cfg, console)
    folder.root.mkdir(parents=True, exist_ok=True)
    folder.config.write_text(cfg.model_dump_json(indent=2))
    console.print(f"starting model: {start_model}")
    if resume_step is not None:
        if resume_step >= cfg.trainer.steps:
            console.print(
                f"run {cfg.run_name} already reached step {resume_step} "
                f"(trainer.steps {cfg.trainer.steps}): nothing left to train"
            )
        else:
            console.print(f"resuming run {cfg.run_name} at step {resume_step}/{cfg.trainer.steps}")
    task = build_task(cfg.task)
    before = None

    if (latest_checkpoint(folder.checkpoints) or 0) < cfg.trainer.steps:
        # Resuming a finished run with more steps: the trainer must not report done at once.
        folder.trainer_done.unlink(missing_ok=True)
    keys = prepare_pool(cfg, adversaries)
    names = {load_identity(path).address: name for name, path in keys.items()}
    sup = Supervisor(cfg.supervision, folder.processes, console.print)
    supervisor.append(sup)
    from swarmrl.shardcast.server import start_server

    origin_root = folder.shardcast / "origin"
    origin_root.mkdir(parents=True, exist_ok=True)
    origin_server = start_server(origin_root)
    # Fixed ports: a restarted orchestrator or relay comes back at the URL the others know.
    port = cfg.pool.port or free_port()
    url = f"http://127.0.0.1:{port}"
    server_urls = {"origin": origin_server.url}
    relay_ports = [free_port() for _ in range(cfg.shardcast.relays)]
    for i, relay_port in enumerate(relay_ports):
        server_urls[f"relay-{i}"] = f"http://127.0.0.1:{relay_port}"
    console.print(f"orchestrator {url}; ledger {folder.ledger}")
    console.print(f"dashboard {url}/dashboard (live, read-only)")
    if adversaries:
        console.print(
            f"adversaries: {', '.join(f'adversary-{kind}' for kind in adversaries)} "
            f"(cheating workers, beside {cfg.worker.count} honest ones)"
        )
    watch = SlashingWatch(url, names, console.print)
    console.print(
        f"checkpoints: origin {origin_server.url} -> "
        + " -> ".join(f"{name} {u}" for name, u in server_urls.items() if name != "origin")
        + " -> workers"
    )
    earlier = read_metrics(folder.metrics)
    shown = earlier[-1].step if earlier else -1
    try:
        # Every process at once: each spends seconds importing torch before its first
        # request, and registering retries until the orchestrator answers (a worker until
        # it is funded, just below), so nobody waits for another's start.
        sup.start(orchestrator_role(cfg, port))
        for role in pool_roles(
            cfg, start_model, url, keys, relay_ports, origin_server.url, adversaries
        ):
            sup.start(role)
        # Imported only now (torch and the model classes: seconds), beside the pool's start.
        import torch

        from swarmrl.evaluation import evaluate
        from swarmrl.validator.service import verdict_counts

        # The evaluations run beside the pool's processes: with torch's default of a
        # thread per core, its threads spin waiting for a contended core (on 2 cores the
        # two evaluations cost ~25 CPU-seconds instead of ~3, and slowed the pool).
        torch.set_num_threads(1)

        if cfg.model.path:
            check_model_dir(start_model)

        wait_for_orchestrator(sup, url)
        # The honest workers and the cheaters alike: a cheater stakes like anyone else.
        workers = [
            load_identity(path)
            for name, path in keys.items()
            if name.startswith(("worker-", "adversary-"))
        ]
        fund_workers(url, owner_key(folder.key("owner")), workers, cfg.pool.stake)
        if cfg.eval_before:
            # Beside the pool's start: the start model is read only, and the trainer's
            # first step waits for the workers' first files anyway.
            with counted(
                console, "evaluating the starting model", len(task.eval_problems())
            ) as advance:
                before = evaluate(start_model, task, cfg, EVAL_BATCH, advance)
            console.print(
                f"before RL: accuracy {before.accuracy:.3f}, length error {before.length_error}"
            )
        with StepDisplay(console, cfg.trainer.steps, started, shown) as display:
            sup.notify = watch.say = display.say
            supervise(cfg, sup, display, url, watch)
        watch.poll(force=True)
        served = {name: server_bytes(u) for name, u in server_urls.items()}
        # Evaluated while the orchestrator is still up, so its dashboard shows the result.
        final_step = latest_checkpoint(folder.checkpoints)
        after = None
        if cfg.eval_after and final_step is not None:
            with counted(
                console, f"evaluating checkpoint {final_step}", len(task.eval_problems())
            ) as advance:
                after = evaluate(
                    checkpoint_dir(folder.checkpoints, final_step), task, cfg, EVAL_BATCH, advance
                )
            report_heldout(url, keys["trainer"], folder.metrics, after.accuracy, console)
    finally:
        sup.stop()
        origin_server.stop()

    records = read_metrics(folder.metrics)
    pool = ledger_figures(folder)
    samples_read = sum(r.samples_read for r in records)
    wait = sum(r.wait_seconds for r in records)
    busy = sum(r.step_seconds for r in records)
    restarts = {name: sup.restarts.get(name, 0) for name in sup.roles}
    evaluated = after or before
    summary = RunSummary(
        run=cfg.run_name,
        run_dir=str(folder.root),
        start_model=str(start_model),
        async_level=cfg.async_level,
        workers=cfg.worker.count,
        accuracy_before=before.accuracy if before is not None else None,
        accuracy_after=after.accuracy if after is not None else None,
        length_error_before=before.length_error if before is not None else None,
        length_error_after=after.length_error if after is not None else None,
        eval_problems=evaluated.problems if evaluated is not None else None,
        steps=len(records),
        final_step=final_step,
        samples_trained=sum(r.samples for r in records),
        samples_read=samples_read,
        samples_generated=pool.samples_generated,
        generated_per_read=round(pool.samples_generated / samples_read, 3)
        if samples_read
        else None,
        files_uploaded=pool.files_uploaded,
        files_trained=pool.files_trained,
        ledger_problems=pool.ledger_problems,
        staleness_max=max((r.staleness_max for r in records), default=None),
        trainer_idle_fraction=wait / busy if busy else None,
        bytes_served=served,
        **proof_figures(folder.workers),
        validation={"fraction": cfg.validator.fraction, **verdict_counts(folder.root)}
        if cfg.validator.fraction > 0
        else None,
        restarts=restarts,
        restarts_total=sum(restarts.values()),
        slashings=len(watch.seen),
        accounts=worker_accounts(watch.status, names),
        cheaters=cheaters_summary(adversaries, keys, watch, sup.ejected),
        wall_seconds=round(time.time() - started, 1),
        cpu_seconds=cpu_by_process(sup.cpu_seconds),
    )
    summary.write(folder.summary)
    summary.print(console)
    console.print(f"summary written to {folder.summary}")
    if cfg.log.backend == "mlflow":
        tracked = open_mlflow(cfg, folder.root)
        tracked.add_scalars(final_step or 0, summary.model_dump(), prefix="summary/")
        tracked.finish()
        console.print(f"summary logged to MLflow run {tracked.run_id}")
    return summary


def cpu_by_process(roles: dict[str, float]) -> dict[str, float]:
    """Each role's CPU-seconds and this process's own (`run`), rounded to 0.1 s."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    spent = {**roles, "run": own.ru_utime + own.ru_stime}
    return {name: round(seconds, 1) for name, seconds in spent.items()}


def report_heldout(
    url: str, trainer_key: Path, metrics: Path, accuracy: float, console: Console
) -> None:
    """Put the final checkpoint's held-out accuracy on the dashboard: the last trained
    step's report again, with it (signed as the trainer, whose route it is)."""
    records = read_metrics(metrics)
    if not records:
        return
    report = dashboard_report(records[-1]).model_copy(update={"heldout_accuracy": accuracy})
    try:
        PoolClient(url, load_identity(trainer_key)).report_metrics(report)
    except (PoolRefused, PoolUnreachable) as exc:
        console.print(f"the held-out accuracy did not reach the dashboard: {exc}")
