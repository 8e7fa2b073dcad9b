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
run folder. Finally evaluates the starting and the final checkpoint on the held-out
split and writes `<output_dir>/<run_name>/summary.json`: accuracy, the samples workers
uploaded against those the trainer read, the bytes each server served, the validator's
verdict counts, the ledger's consistency and the restarts of each process.

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

import json
import logging
import math
import os
import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from swarmrl.checkpoints import checkpoint_dir, latest_checkpoint
from swarmrl.config import ConfigError, RunConfig, load_config, run_differences
from swarmrl.display import StepDisplay, counted
from swarmrl.evaluation import evaluate
from swarmrl.identity import Identity, generate_key_file, load_identity
from swarmrl.jsonl import read_jsonl
from swarmrl.ledger import Ledger, check_ledger
from swarmrl.ledger.models import Submission
from swarmrl.model.build import ensure_default_model
from swarmrl.protocol import models as api
from swarmrl.protocol.funding import fund_workers, owner_key, staking_flags
from swarmrl.rollouts import RolloutBounds
from swarmrl.runfolder import RunFolder
from swarmrl.supervisor import Role, Supervisor, SwarmError, tail
from swarmrl.tasks.registry import build_task
from swarmrl.trainer.metrics import read_metrics
from swarmrl.validator.service import verdict_counts

__all__ = ["RunInterrupted", "SwarmError", "run_swarm"]

EVAL_BATCH = 64  # problems per evaluation batch: the bar's count advances per batch
WAIT_REPORT_SECONDS = 60.0  # a trainer wait longer than this is reported, and then again
FINISH_TIMEOUT = {"validator": 120.0, "worker": 60.0}  # after the trainer is done
SLASHINGS_POLL_SECONDS = 3.0  # how often the console looks for new slashings
ORCHESTRATOR_START_SECONDS = 120.0  # the first answer of a freshly started orchestrator


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run; the message says what is left and how to resume."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def check_model_dir(path: Path) -> None:
    """Raise SwarmError with one line unless `path` is a loadable Hugging Face model directory."""
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise SwarmError(
            f"model.path {path} is not a Hugging Face model directory (no config.json)"
        )
    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SwarmError(
            f"model.path {path}: config.json is not a valid model config ({first})"
        ) from None


def resolve_start_model(cfg: RunConfig, console: Console) -> Path:
    if cfg.model.path:
        path = Path(cfg.model.path)
        check_model_dir(path)
        return path
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("warm start of the embedded model"),
        BarColumn(bar_width=20),
        TextColumn("{task.completed}/{task.total} loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("sft", total=None, loss=float("nan"))
        last_line = time.monotonic()

        def report(step: int, total: int, loss: float) -> None:
            nonlocal last_line
            progress.update(bar, completed=step, total=total, loss=loss)
            # Without a live bar: a line at least every 30 s, so a log shows it is alive.
            if not console.is_terminal and (time.monotonic() - last_line >= 20 or step == total):
                console.print(f"warm start {step}/{total} loss {loss:.3f}", soft_wrap=True)
                last_line = time.monotonic()

        return ensure_default_model(
            Path(cfg.model.cache_dir) if cfg.model.cache_dir else None, progress=report
        )


def prepare_folder(cfg: RunConfig, fresh: bool, console: Console) -> int | None:
    """Check the run folder before anything is written to it. Returns the step a
    resumed run continues at, or None for a new run; raises SwarmError (one line) when
    the folder holds a different run."""
    folder = cfg.folder
    if fresh and folder.root.exists():
        shutil.rmtree(folder.root)
        console.print(f"--fresh: removed the previous run folder {folder.root}")
    if fresh and folder.workers.exists():
        shutil.rmtree(folder.workers)
        console.print(f"--fresh: removed the previous workers' folders {folder.workers}")
    if not folder.config.exists():
        return None
    start_over = f"choose another --run_name, or add --fresh to delete {folder.root} and start over"
    try:
        saved = load_config(folder.config)
    except ConfigError as exc:
        raise SwarmError(
            f"{folder.root} holds a run whose config cannot be read ({exc}); {start_over}"
        ) from None
    differences = run_differences(saved, cfg)
    if differences:
        raise SwarmError(
            f"run {cfg.run_name!r} in {folder.root} was started with a different "
            f"{'; '.join(differences)}; {start_over}"
        )
    return latest_checkpoint(folder.checkpoints)


def _proof_figures(workers: Path) -> dict[str, float | None]:
    """From the workers' per-file stats: TOPLOC proof building's CPU time, and the time
    generation waited for it (it is built off the generation loop), each over generation time."""
    gen = proofs = waited = 0.0
    for path in workers.glob("worker-*/stats.jsonl"):
        for record in read_jsonl(path):  # a line cut short by a killed worker is skipped
            try:
                gen += record["gen_seconds"]
                proofs += record["proof_seconds"]
                waited += record.get("proof_wait_seconds", 0.0)
            except (KeyError, TypeError):
                continue
    return {
        "proof_share_of_generation": round(proofs / gen, 4) if gen else None,
        "proof_wait_share_of_generation": round(waited / gen, 4) if gen else None,
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_bytes(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/stats.json", timeout=5) as response:
            return json.loads(response.read())["bytes_served"]
    except (OSError, ValueError, KeyError):
        return None


def wait_report(
    folder: RunFolder, now: float, step: int, pool: api.StepStatus | None
) -> tuple[int, float, str] | None:
    """The trainer's wait for `step` (the next step to train) as (step, seconds waited,
    one line), or None when its status is about another step (a step whose samples were
    all there at once leaves the previous step's status in place) or being replaced.
    `pool` is the orchestrator's view of the step (None: it did not answer)."""
    try:
        status = json.loads(folder.trainer_status.read_text())
        usable, needed, since = (
            int(status["usable"]),
            int(status["needed"]),
            float(status["since"]),
        )
        if int(status["step"]) != step:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pool is None:
        seen = "the orchestrator did not answer"
    elif pool.submissions == 0:
        seen = f"no file uploaded for it yet, {pool.open_assignments} assignment(s) open"
    else:
        seen = (
            f"{pool.submissions} file(s) uploaded for it, {pool.open_assignments} assignment(s) "
            f"open, {pool.lapsed_assignments} lapsed"
        )
    waited = now - since
    return (
        step,
        waited,
        f"step {step}: {usable}/{needed} usable samples after {waited:.0f} s; {seen}",
    )


def ensure_key(path: Path) -> Identity:
    """The key in `path`: written (mode 0600) for a new run, reused when it resumes."""
    if path.exists():
        return load_identity(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return generate_key_file(path)


def trusted_roles(cfg: RunConfig) -> dict[str, api.Role]:
    """The run's processes that the orchestrator admits by allowlist: name -> role."""
    roles: dict[str, api.Role] = {"trainer": "trainer"}
    roles.update({f"relay-{i}": "relay" for i in range(cfg.shardcast.relays)})
    if cfg.validator.fraction > 0:
        roles["validator"] = "validator"
    return roles


def prepare_pool(cfg: RunConfig, adversaries: Sequence[str] = ()) -> dict[str, Path]:
    """Keys for every process (the trusted roles' in `<run>/keys/`, each worker's and
    each adversary's in its own folder) and the allowlist naming the trusted roles'
    addresses; returns each process's key file."""
    folder = cfg.folder
    keys: dict[str, Path] = {}
    lines = ["# written by `swarmrl run`: the addresses of the run's trusted processes"]
    for name, role in trusted_roles(cfg).items():
        keys[name] = folder.key(name)
        lines.append(f"{ensure_key(keys[name]).address} {role}  # {name}")
    for i in range(cfg.worker.count):
        keys[f"worker-{i}"] = folder.worker_dir(i) / "key"
        ensure_key(keys[f"worker-{i}"])
    for kind in adversaries:
        keys[f"adversary-{kind}"] = folder.adversary_dir(kind) / "key"
        ensure_key(keys[f"adversary-{kind}"])
    folder.orchestrator.mkdir(parents=True, exist_ok=True)
    tmp = folder.allowlist.with_name(f".{folder.allowlist.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(folder.allowlist)
    return keys


def ledger_url(folder: RunFolder) -> str:
    return f"sqlite:///{folder.ledger.resolve()}"


def orchestrator_role(cfg: RunConfig, port: int) -> Role:
    folder = cfg.folder
    args = [
        "orchestrator",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ledger",
        ledger_url(folder),
        "--store",
        str(folder.store.resolve()),
        "--secret-file",
        str(folder.secret.resolve()),
        "--allowlist",
        str(folder.allowlist.resolve()),
        "--run-id",
        cfg.run_name,
        "--batch-samples",
        str(cfg.trainer.batch_samples),
        "--prompts-per-assignment",
        str(cfg.worker.prompts_per_file),
        "--group-size",
        str(cfg.sampling.group_size),
        "--async-level",
        str(cfg.async_level),
        "--surplus",
        str(cfg.pool.surplus),
        "--validation-fraction",
        str(cfg.validator.fraction),
        "--heartbeat-seconds",
        str(cfg.pool.heartbeat_seconds),
        "--unhealthy-after",
        str(max(1, math.ceil(cfg.pool.dead_seconds / 2 / cfg.pool.heartbeat_seconds))),
        "--dead-after",
        str(max(1, math.ceil(cfg.pool.dead_seconds / cfg.pool.heartbeat_seconds))),
        "--assignment-seconds",
        str(cfg.pool.assignment_seconds),
        # The validator's bounds on a file: an upload is refused past them before decoding.
        "--max-new-tokens",
        str(RolloutBounds.for_run(cfg).max_new_tokens),
        "--max-prompt-tokens",
        str(RolloutBounds.for_run(cfg).max_prompt_tokens),
    ]
    if cfg.trainer.steps > 0:
        args += ["--steps", str(cfg.trainer.steps)]
    args += staking_flags(owner_key(folder.key("owner")), cfg.pool.stake)
    return Role("orchestrator", args, folder.log("orchestrator"), finishes=False)


def pool_status(url: str, timeout: float = 5.0) -> api.PoolStatus | None:
    """The orchestrator's `/v1/status`, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/v1/status", timeout=timeout) as response:
            return api.PoolStatus.model_validate_json(response.read())
    except (OSError, ValueError):
        return None


def wait_for_orchestrator(sup: Supervisor, url: str) -> None:
    """Until the orchestrator answers; a start that keeps failing ends the run (SwarmError)."""
    deadline = time.monotonic() + ORCHESTRATOR_START_SECONDS
    while pool_status(url) is None:
        sup.poll()
        if time.monotonic() > deadline:
            raise SwarmError(
                f"the orchestrator did not answer at {url} within {ORCHESTRATOR_START_SECONDS:.0f} s; "
                f"last lines of {sup.roles['orchestrator'].role.log}:\n"
                f"{tail(sup.roles['orchestrator'].role.log)}"
            )
        time.sleep(0.2)


def pool_roles(
    cfg: RunConfig,
    start_model: Path,
    url: str,
    keys: dict[str, Path],
    relay_ports: list[int],
    origin: str,
    adversaries: Sequence[str] = (),
) -> list[Role]:
    """Every process of the run but the orchestrator, in start order."""
    folder = cfg.folder
    config_path = str(folder.config)
    pool = ["--orchestrator", url]
    roles = []
    upstream = origin
    for i, port in enumerate(relay_ports):
        name = f"relay-{i}"
        root = folder.shardcast / name
        roles.append(
            Role(
                name,
                [
                    "relay",
                    *pool,
                    "--key",
                    str(keys[name]),
                    "--upstream",
                    upstream,
                    "--root",
                    str(root),
                    "--port",
                    str(port),
                    "--poll-s",
                    str(cfg.shardcast.poll_seconds),
                ],
                folder.log(name),
                finishes=False,
            )
        )
        upstream = f"http://127.0.0.1:{port}"
    roles.append(
        Role(
            "trainer",
            [
                "trainer",
                "--config",
                config_path,
                "--start-model",
                str(start_model),
                *pool,
                "--key",
                str(keys["trainer"]),
                "--origin-url",
                origin,
            ],
            folder.log("trainer"),
            cfg.trainer.threads,
        )
    )
    for i in range(cfg.worker.count):
        name = f"worker-{i}"
        roles.append(
            Role(
                name,
                [
                    "worker",
                    "--config",
                    config_path,
                    *pool,
                    "--key",
                    str(keys[name]),
                    "--workdir",
                    str(folder.worker_dir(i)),
                ],
                folder.log(name),
                cfg.worker.threads,
            )
        )
    for kind in adversaries:
        name = f"adversary-{kind}"
        # A copier reads the rollout store, as it could a storage bucket readable by workers.
        source = ["--copy-from", str(folder.store.resolve())] if kind == "copy" else []
        roles.append(
            Role(
                name,
                [
                    "worker",
                    "--config",
                    config_path,
                    *pool,
                    "--key",
                    str(keys[name]),
                    "--workdir",
                    str(folder.adversary_dir(kind)),
                    "--adversary",
                    kind,
                    *source,
                ],
                folder.log(name),
                cfg.worker.threads,
            )
        )
    if cfg.validator.fraction > 0:
        roles.append(
            Role(
                "validator",
                ["validator", "--config", config_path, *pool, "--key", str(keys["validator"])],
                folder.log("validator"),
                cfg.validator.threads,
            )
        )
    return roles


def failed_check(reason: str) -> str:
    """The check a verdict's reason names: 'rejected: toploc: sample 3: ...' -> 'toploc';
    an unusable file ('unusable: ...') -> 'unusable'."""
    parts = reason.split(": ", 2)
    return parts[1] if parts[0] == "rejected" and len(parts) > 1 else parts[0]


class SlashingWatch:
    """Follows the orchestrator's slashings and says each new one in one line, naming
    the run's process that was slashed."""

    def __init__(self, url: str, names: dict[str, str], say) -> None:
        self.url = url
        self.names = names  # address -> process name
        self.say = say
        self.seen: list[api.Slashing] = []
        self.status: api.PoolStatus | None = None  # the newest answer
        self.polled_at = 0.0

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.polled_at < SLASHINGS_POLL_SECONDS:
            return
        self.polled_at = now
        status = pool_status(self.url)
        if status is None:
            return
        self.status = status
        for slashing in status.slashings[len(self.seen) :]:
            self.seen.append(slashing)
            self.say(self.line(slashing))

    def line(self, s: api.Slashing) -> str:
        who = self.names.get(s.address, s.address)
        when = time.strftime("%H:%M:%S", time.localtime(s.at))
        tainted = (
            f", {s.tainted_files} already trained (tainted steps "
            f"{', '.join(map(str, s.tainted_steps))})"
            if s.tainted_files
            else ", none trained"
        )
        return (
            f"caught {who} at {when} (step {s.step}) by the {failed_check(s.reason)} check: "
            f"{s.reason}; stake slashed {s.slashed:g}; {s.voided_files} file(s) voided"
            f"{tainted}; ejected"
        )


def worker_accounts(status: api.PoolStatus | None, names: dict[str, str]) -> dict[str, dict]:
    """Per worker process (honest or not), as the orchestrator last showed it: its status
    and its funds (balance, stake, paid, unpaid)."""
    return {
        names.get(m.address, m.address): {
            "status": m.status,
            "balance": m.balance,
            "stake": m.stake,
            "paid": m.paid,
            "unpaid": m.unpaid,
        }
        for m in (status.members if status else [])
        if m.role == "worker"
    }


def cheaters_summary(
    adversaries: Sequence[str],
    keys: dict[str, Path],
    watch: SlashingWatch,
    stopped: set[str],
) -> list[dict]:
    """Per adversary: its address; when and by which check it was caught and what it
    lost; whether the pool ejected it, and whether its process stopped on the ejection
    (`stopped`: a cheater caught after the run finished just ends with the run)."""
    members = {m.address: m for m in (watch.status.members if watch.status else [])}
    out = []
    for kind in adversaries:
        name = f"adversary-{kind}"
        address = load_identity(keys[name]).address
        caught = next((s for s in watch.seen if s.address == address), None)
        record: dict = {
            "name": name,
            "kind": kind,
            "address": address,
            "caught": caught is not None,
        }
        if caught is not None:
            record |= {
                "caught_at": caught.at,
                "step": caught.step,
                "check": failed_check(caught.reason),
                "reason": caught.reason,
                "slashed": caught.slashed,
                "files_voided": caught.voided_files,
                "files_tainted": caught.tainted_files,
                "tainted_steps": caught.tainted_steps,
            }
        member = members.get(address)
        record["ejected"] = member is not None and member.status == "ejected"
        record["stopped_on_ejection"] = name in stopped
        out.append(record)
    return out


def _supervise(
    cfg: RunConfig, sup: Supervisor, display: StepDisplay, url: str, watch: SlashingWatch
) -> None:
    """Watch the processes until the trainer is done, report its long waits and every
    slashing, then let the workers and the validator finish."""
    folder = cfg.folder
    reported_at: dict[int, float] = {}
    while sup.exited("trainer") is None:
        sup.poll()
        watch.poll()
        records = read_metrics(folder.metrics)
        display.update(records)
        step = records[-1].step + 1 if records else 0
        report = wait_report(folder, time.time(), step, None)
        if report is not None:
            _, waited, _ = report
            if (
                waited >= WAIT_REPORT_SECONDS
                and waited - reported_at.get(step, 0.0) >= WAIT_REPORT_SECONDS
            ):
                status = pool_status(url)
                seen = next((s for s in status.steps if s.step == step), None) if status else None
                report = wait_report(folder, time.time(), step, seen)
                if report is not None:
                    display.say(report[2])
                reported_at[step] = waited
        time.sleep(0.5)
    display.update(read_metrics(folder.metrics))
    deadline = {
        name: time.monotonic() + FINISH_TIMEOUT["validator" if name == "validator" else "worker"]
        for name, running in sup.roles.items()
        if running.role.finishes and name != "trainer"
    }
    while deadline:
        sup.poll()
        watch.poll()
        for name in list(deadline):
            if sup.exited(name) is not None:
                del deadline[name]
            elif time.monotonic() > deadline[name]:
                display.say(f"{name} still running after the trainer finished; stopping it")
                del deadline[name]
        time.sleep(0.2)


def accounts_table(accounts: dict[str, dict]) -> Table:
    table = Table(title="workers")
    for column in ("worker", "status", "balance", "stake", "paid", "unpaid"):
        table.add_column(column, justify="left" if column in ("worker", "status") else "right")
    for name, a in sorted(accounts.items()):
        table.add_row(
            name, a["status"], *(f"{a[k]:g}" for k in ("balance", "stake", "paid", "unpaid"))
        )
    return table


def cheaters_table(cheaters: list[dict]) -> Table:
    table = Table(title="cheaters")
    for column in (
        "worker",
        "caught at",
        "step",
        "check",
        "slashed",
        "voided",
        "tainted",
        "ejected",
    ):
        table.add_column(column)
    for c in cheaters:
        if not c["caught"]:
            table.add_row(
                c["name"], "not caught", "", "", "", "", "", "yes" if c["ejected"] else "no"
            )
            continue
        table.add_row(
            c["name"],
            time.strftime("%H:%M:%S", time.localtime(c["caught_at"])),
            str(c["step"]),
            c["check"],
            f"{c['slashed']:g}",
            str(c["files_voided"]),
            str(c["files_tainted"]),
            "yes" if c["ejected"] else "no",
        )
    return table


def ledger_figures(folder: RunFolder) -> dict:
    """What the ledger says once the orchestrator has stopped: the files and samples the
    workers uploaded, and every broken invariant (nothing lost or counted twice)."""
    ledger = Ledger(ledger_url(folder))
    try:
        with ledger.session() as session:
            submissions = list(session.scalars(select(Submission)))
            problems = check_ledger(session)
    finally:
        ledger.close()
    return {
        "files_uploaded": len(submissions),
        "samples_generated": sum(s.num_samples for s in submissions),
        "files_trained": sum(s.trained_step is not None for s in submissions),
        "ledger_problems": problems,
    }


def run_swarm(
    cfg: RunConfig,
    console: Console | None = None,
    fresh: bool = False,
    adversaries: Sequence[str] = (),
) -> dict:
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
) -> dict:
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
    if cfg.eval_before:
        with counted(
            console, "evaluating the starting model", len(task.eval_problems())
        ) as advance:
            before = evaluate(start_model, task, cfg, EVAL_BATCH, advance)
        console.print(
            f"before RL: accuracy {before['accuracy']:.3f}, length error {before['length_error']}"
        )

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
    try:
        sup.start(orchestrator_role(cfg, port))
        wait_for_orchestrator(sup, url)
        # The honest workers and the cheaters alike: a cheater stakes like anyone else.
        workers = [
            load_identity(path)
            for name, path in keys.items()
            if name.startswith(("worker-", "adversary-"))
        ]
        fund_workers(url, owner_key(folder.key("owner")), workers, cfg.pool.stake)
        for role in pool_roles(
            cfg, start_model, url, keys, relay_ports, origin_server.url, adversaries
        ):
            sup.start(role)
        earlier = read_metrics(folder.metrics)
        shown = earlier[-1].step if earlier else -1
        with StepDisplay(console, cfg.trainer.steps, started, shown) as display:
            sup.notify = watch.say = display.say
            _supervise(cfg, sup, display, url, watch)
        watch.poll(force=True)
        served = {name: _server_bytes(u) for name, u in server_urls.items()}
    finally:
        sup.stop()
        origin_server.stop()

    final_step = latest_checkpoint(folder.checkpoints)
    after = None
    if cfg.eval_after and final_step is not None:
        with counted(
            console, f"evaluating checkpoint {final_step}", len(task.eval_problems())
        ) as advance:
            after = evaluate(
                checkpoint_dir(folder.checkpoints, final_step), task, cfg, EVAL_BATCH, advance
            )
    records = read_metrics(folder.metrics)
    pool = ledger_figures(folder)
    samples_read = sum(r.samples_read for r in records)
    wait = sum(r.wait_seconds for r in records)
    busy = sum(r.step_seconds for r in records)
    restarts = {name: sup.restarts.get(name, 0) for name in sup.roles}
    summary = {
        "run": cfg.run_name,
        "run_dir": str(folder.root),
        "start_model": str(start_model),
        "async_level": cfg.async_level,
        "workers": cfg.worker.count,
        "accuracy_before": before["accuracy"] if before else None,
        "accuracy_after": after["accuracy"] if after else None,
        "length_error_before": before["length_error"] if before else None,
        "length_error_after": after["length_error"] if after else None,
        "eval_problems": (after or before or {}).get("problems"),
        "steps": len(records),
        "final_step": final_step,
        "samples_trained": sum(r.samples for r in records),
        "samples_read": samples_read,
        "samples_generated": pool["samples_generated"],
        "generated_per_read": round(pool["samples_generated"] / samples_read, 3)
        if samples_read
        else None,
        "files_uploaded": pool["files_uploaded"],
        "files_trained": pool["files_trained"],
        "ledger_problems": pool["ledger_problems"],
        "staleness_max": max((r.staleness_max for r in records), default=None),
        "trainer_idle_fraction": wait / busy if busy else None,
        "bytes_served": served,
        **_proof_figures(folder.workers),
        "validation": {"fraction": cfg.validator.fraction, **verdict_counts(folder.root)}
        if cfg.validator.fraction > 0
        else None,
        "restarts": restarts,
        "restarts_total": sum(restarts.values()),
        "slashings": len(watch.seen),
        "accounts": worker_accounts(watch.status, names),
        "cheaters": cheaters_summary(adversaries, keys, watch, sup.ejected),
        "wall_seconds": round(time.time() - started, 1),
    }
    folder.summary.write_text(json.dumps(summary, indent=2))
    table = Table(title=f"swarmrl run {cfg.run_name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key in ("accounts", "cheaters"):
            continue  # tables of their own
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(accounts_table(summary["accounts"]))
    if adversaries:
        console.print(cheaters_table(summary["cheaters"]))
    console.print(f"summary written to {folder.summary}")
    return summary
