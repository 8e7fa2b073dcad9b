"""`swarmrl run`: a whole swarm on one machine, from warm start to held-out evaluation.

Starts the trainer, N inference workers and a validator (judging a secret random
fraction of the rollout files) as separate processes. Checkpoints travel
trainer -> SHARDCAST origin (served from this process) -> a chain of relay processes ->
workers; rollout files travel back through the run folder. Shows live progress from
the trainer's metrics, stops everything if any process fails (printing its log tail),
and finally evaluates the starting and the final checkpoint on the held-out split and
writes `<output_dir>/<run_name>/summary.json`, including the bytes each server served
and the validator's verdict counts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from swarmrl.checkpoints import checkpoint_dir, latest_checkpoint
from swarmrl.config import RunConfig
from swarmrl.evaluation import evaluate
from swarmrl.jsonl import read_jsonl
from swarmrl.model.build import ensure_default_model
from swarmrl.tasks.registry import build_task
from swarmrl.trainer.trainer import read_metrics
from swarmrl.validator.service import verdict_counts


class SwarmError(RuntimeError):
    """A process of the swarm failed; the message carries its log tail."""


def resolve_start_model(cfg: RunConfig, console: Console) -> Path:
    if cfg.model.path:
        path = Path(cfg.model.path)
        if not (path / "config.json").exists():
            raise SwarmError(
                f"model.path {path} is not a Hugging Face model directory (no config.json)"
            )
        return path
    with Progress(
        TextColumn("warm start of the embedded model"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("sft", total=None, loss=float("nan"))

        def report(step: int, total: int, loss: float) -> None:
            progress.update(bar, completed=step, total=total, loss=loss)
            if not console.is_terminal and (step % 100 == 0 or step == total):
                console.print(f"warm start {step}/{total} loss {loss:.3f}")

        return ensure_default_model(
            Path(cfg.model.cache_dir) if cfg.model.cache_dir else None, progress=report
        )


def _spawn(args: list[str], log_path: Path, threads: int) -> subprocess.Popen:
    env = dict(
        os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1"
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log_path, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "swarmrl", *args],
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _proof_figures(logs: Path) -> dict[str, float | None]:
    """From the workers' per-file logs: TOPLOC proof building's CPU time, and the time
    generation waited for it (it is built off the generation loop), each over generation time."""
    gen = proofs = waited = 0.0
    for path in logs.glob("worker-*.jsonl"):
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


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(procs: dict[str, subprocess.Popen], grace: float = 5.0) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_bytes(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/stats.json", timeout=5) as response:
            return json.loads(response.read())["bytes_served"]
    except (OSError, ValueError, KeyError):
        return None


def run_swarm(cfg: RunConfig, console: Console | None = None) -> dict:
    console = console or Console(stderr=True)
    started = time.time()
    folder = cfg.folder
    run_dir = folder.root
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = folder.config
    config_path.write_text(cfg.model_dump_json(indent=2))
    start_model = resolve_start_model(cfg, console)
    console.print(f"starting model: {start_model}")
    task = build_task(cfg.task)
    before = None
    if cfg.eval_before:
        with console.status("evaluating the starting model on the held-out split"):
            before = evaluate(start_model, task, cfg)
        console.print(
            f"before RL: accuracy {before['accuracy']:.3f}, length error {before['length_error']}"
        )

    logs = folder.logs
    done_marker = folder.trainer_done
    last_step = latest_checkpoint(folder.checkpoints)
    if done_marker.exists() and (last_step or 0) < cfg.trainer.steps:
        done_marker.unlink()  # resuming a finished run with more steps: workers must not stop at once
    procs: dict[str, subprocess.Popen] = {}
    origin_server = None
    server_urls: dict[str, str] = {}
    if cfg.shardcast.enabled:
        from swarmrl.shardcast.server import start_server

        origin_root = folder.shardcast / "origin"
        origin_root.mkdir(parents=True, exist_ok=True)
        origin_server = start_server(origin_root)
        server_urls["origin"] = origin_server.url
        upstream = origin_server.url
        for i in range(cfg.shardcast.relays):
            port = _free_port()
            procs[f"relay-{i}"] = _spawn(
                [
                    "relay",
                    "--upstream",
                    upstream,
                    "--root",
                    str(folder.shardcast / f"relay-{i}"),
                    "--port",
                    str(port),
                    "--poll-s",
                    str(cfg.shardcast.poll_seconds),
                ],
                folder.log(f"relay-{i}"),
                1,
            )
            upstream = server_urls[f"relay-{i}"] = f"http://127.0.0.1:{port}"
        cfg = cfg.model_copy(
            update={"shardcast": cfg.shardcast.model_copy(update={"servers": [upstream]})}
        )
        config_path.write_text(cfg.model_dump_json(indent=2))
        console.print(
            f"checkpoints: origin {origin_server.url} -> "
            + " -> ".join(f"{name} {url}" for name, url in server_urls.items() if name != "origin")
            + " -> workers"
        )
    procs["trainer"] = _spawn(
        ["trainer", "--config", str(config_path), "--start-model", str(start_model)],
        folder.log("trainer"),
        cfg.trainer.threads,
    )
    for i in range(cfg.worker.count):
        procs[f"worker-{i}"] = _spawn(
            ["worker", "--config", str(config_path), "--address", f"worker-{i}"],
            folder.log(f"worker-{i}"),
            cfg.worker.threads,
        )
    if cfg.validator.fraction > 0:
        procs["validator"] = _spawn(
            ["validator", "--config", str(config_path)],
            folder.log("validator"),
            cfg.validator.threads,
        )
    metrics_path = folder.metrics
    try:
        with Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            TextColumn("step {task.completed}/{task.total}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            bar = progress.add_task(
                "train", total=cfg.trainer.steps, info="waiting for the first rollouts"
            )
            shown_step = -1
            while True:
                for name, proc in procs.items():
                    code = proc.poll()
                    if code not in (None, 0) or (code == 0 and name == "trainer"):
                        break
                else:
                    code = None
                    name = None
                records = read_metrics(metrics_path)
                if records:
                    last = records[-1]
                    info = (
                        f"reward {last['reward']:+.3f} task {last['task_reward']:.3f} |len err| {last['length_error']:.1f} "
                        f"grad {last['grad_norm']:.3f} clip {last['clip_ratio']:.3f} stale {last['staleness_mean']:.2f} "
                        f"wait {last['wait_seconds']:.1f}s"
                    )
                    progress.update(bar, completed=last["step"] + 1, info=info)
                    if not console.is_terminal and last["step"] > shown_step:
                        # No live bar in a log file: one line per step instead.
                        console.print(f"step {last['step'] + 1}/{cfg.trainer.steps} {info}")
                        shown_step = last["step"]
                if name is not None:
                    if code != 0:
                        raise SwarmError(
                            f"{name} exited with code {code}; last lines of {folder.log(name)}:\n"
                            + _tail(folder.log(name))
                        )
                    break
                time.sleep(0.5)
        for name, proc in procs.items():
            if name.startswith("worker") or name == "validator":
                try:
                    proc.wait(timeout=120 if name == "validator" else 60)
                except subprocess.TimeoutExpired:
                    pass
                if proc.returncode not in (None, 0):
                    raise SwarmError(
                        f"{name} exited with code {proc.returncode}; last lines:\n"
                        + _tail(folder.log(name))
                    )
        served = {name: _server_bytes(url) for name, url in server_urls.items()}
    finally:
        _stop(procs)
        if origin_server is not None:
            origin_server.stop()

    final_step = latest_checkpoint(folder.checkpoints)
    after = None
    if cfg.eval_after and final_step is not None:
        with console.status(f"evaluating checkpoint {final_step} on the held-out split"):
            after = evaluate(checkpoint_dir(folder.checkpoints, final_step), task, cfg)
    records = read_metrics(metrics_path)
    wait = sum(r["wait_seconds"] for r in records)
    busy = sum(r["step_seconds"] for r in records)
    summary = {
        "run": cfg.run_name,
        "run_dir": str(run_dir),
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
        "samples_trained": sum(r["samples"] for r in records),
        "samples_generated": sum(r["samples_read"] for r in records),
        "staleness_max": max((r["staleness_max"] for r in records), default=None),
        "trainer_idle_fraction": wait / busy if busy else None,
        "bytes_served": served,
        **_proof_figures(logs),
        "validation": {"fraction": cfg.validator.fraction, **verdict_counts(run_dir)}
        if cfg.validator.fraction > 0
        else None,
        "wall_seconds": round(time.time() - started, 1),
    }
    folder.summary.write_text(json.dumps(summary, indent=2))
    table = Table(title=f"swarmrl run {cfg.run_name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"summary written to {folder.summary}")
    return summary
