"""The run folder and every role's command line: keys, allowlist and the processes in
start order (the orchestrator first), as `swarmrl run` starts them under supervision."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from swarmrl.config import ConfigError, RunConfig, load_config, run_differences
from swarmrl.identity import Identity, generate_key_file, load_identity
from swarmrl.model.build import ensure_default_model
from swarmrl.orchestrator.config import orchestrator_settings, write_orchestrator_config
from swarmrl.protocol import models as api
from swarmrl.protocol.funding import owner_key
from swarmrl.runfolder import RunFolder, latest_checkpoint
from swarmrl.supervisor import ProcessSpec, SwarmError


def read_model_config(path: Path) -> dict:
    """`path`'s config.json, if it is a JSON object naming a `model_type`; else SwarmError
    with one line. The quick check, before any process starts; `check_model_dir` is the
    whole one (for a model outside model/lite.py's, transformers' parser: seconds of
    imports, so made beside the pool's start)."""
    if not (path / "config.json").is_file():
        raise SwarmError(
            f"model.path {path} is not a Hugging Face model directory (no config.json)"
        )
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise SwarmError(
            f"model.path {path}: config.json is not a valid model config ({exc})"
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise SwarmError(
            f"model.path {path}: config.json is not a valid model config (no model_type)"
        )
    return config


def check_model_dir(path: Path) -> None:
    """Raise SwarmError with one line unless `path` is a loadable Hugging Face model directory."""
    from swarmrl.model.lite import lite_config

    if lite_config(read_model_config(path)) is not None:
        return  # a config model/lite.py reads whole: the roles load it without transformers
    from transformers import AutoConfig

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
        read_model_config(path)  # the whole check_model_dir runs once the pool is starting
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def orchestrator_role(cfg: RunConfig, port: int) -> ProcessSpec:
    """The orchestrator's process: its settings derived from the run's config and written
    to <run>/orchestrator/config.toml, which it reads; only the port is its own."""
    folder = cfg.folder
    owner = owner_key(folder.key("owner")).address if cfg.pool.stake > 0 else None
    settings = orchestrator_settings(
        cfg,
        ledger=ledger_url(folder),
        store=str(folder.store.resolve()),
        secret_file=str(folder.secret.resolve()),
        allowlist=str(folder.allowlist.resolve()),
        owner=owner,
    )
    write_orchestrator_config(settings, folder.orchestrator_config)
    args = ["orchestrator", "--config", str(folder.orchestrator_config.resolve())]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    return ProcessSpec("orchestrator", args, folder.log("orchestrator"), finishes=False)


def worker_role(
    cfg: RunConfig, name: str, workdir: Path, url: str, key: Path, adversary: str | None = None
) -> ProcessSpec:
    """An inference worker's process: honest, or (`adversary`: its kind) a cheating one."""
    folder = cfg.folder
    cheat: list[str] = []
    if adversary is not None:
        cheat = ["--adversary", adversary]
        if adversary == "copy":
            # A copier reads the rollout store, as it could a storage bucket readable by workers.
            cheat += ["--copy-from", str(folder.store.resolve())]
    args = ["worker", "--config", str(folder.config), "--orchestrator", url, "--key", str(key)]
    return ProcessSpec(
        name, [*args, "--workdir", str(workdir), *cheat], folder.log(name), cfg.worker.threads
    )


def pool_roles(
    cfg: RunConfig,
    start_model: Path,
    url: str,
    keys: dict[str, Path],
    relay_ports: list[int],
    origin: str,
    adversaries: Sequence[str] = (),
) -> list[ProcessSpec]:
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
            ProcessSpec(
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
        ProcessSpec(
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
        roles.append(worker_role(cfg, name, folder.worker_dir(i), url, keys[name]))
    for kind in adversaries:
        name = f"adversary-{kind}"
        roles.append(worker_role(cfg, name, folder.adversary_dir(kind), url, keys[name], kind))
    if cfg.validator.fraction > 0:
        roles.append(
            ProcessSpec(
                "validator",
                ["validator", "--config", config_path, *pool, "--key", str(keys["validator"])],
                folder.log("validator"),
                cfg.validator.threads,
            )
        )
    return roles
