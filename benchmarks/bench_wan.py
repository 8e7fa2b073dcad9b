"""The pool over slow links: every role in its own network namespace, worker and relay
links capped with `tbf`, full checkpoints against deltas, side by side.

    sudo python benchmarks/bench_wan.py --json /tmp/wan.json
    sudo python benchmarks/bench_wan.py --configs open-delta,20-delta --repeats 1 --steps 10

Needs root and `ip netns`; without them it prints one line and exits 0. It makes one
namespace per role (orchestrator, trainer with its SHARDCAST origin, relay, two workers,
validator) and a hub namespace holding a bridge, each role joined to the bridge by a
veth pair whose ends are created directly inside the namespaces (nothing is added to the
machine's own network). Addresses are 10.250.X.0/24, X from this process's id; every
name carries the id too. A capped link has `tbf` on both ends of its veth (the role's
egress and the bridge's egress towards it), so uploads and downloads are both capped;
the trainer's, the orchestrator's and the validator's links are never capped.

Each role is started as docs/deployment.md starts it by hand (`python -m swarmrl
orchestrator|trainer|origin|relay|worker|validator` with the documented flags), each in
its own folder, on the embedded default model, `--steps` steps, the run's defaults
otherwise (eval off, `pool.stake = 0`: a closed pool). A configuration is a link rate
(`open` = no cap, or mbit) and `full` (`shardcast.deltas = false`), `delta` (the
default) or `origin` (deltas, and workers fetch from the origin as well as the relay:
`shardcast.workers_fetch_origin = true`), optionally followed by `-bf16` (checkpoints
broadcast rounded to bf16: `shardcast.dtype = "bf16"`). Configurations are interleaved:
each repeat runs all of them once in turn.

Figures per run (`wan_figures.py`), over the steady steps (step 0, whose wait is the
roles starting, is left out): trainer idle = wait / step time summed (as `swarmrl run`'s
`trainer_idle_fraction`), seconds per step, per worker the time from the checkpoint's
announcement (the ledger's `announced_at`) to its "loaded policy" log line (median,
worst) and where it went (relay mirrored, fetch started, fetch, load), and the bytes the
origin and the relay served (`/stats.json`). Printed as median [min–max] over repeats;
`--json FILE` writes every run and the summaries.

Everything is bounded (`--run-timeout` per run, 30 s per setup command) and torn down on
every exit path (finally, and SIGINT/SIGTERM/SIGHUP turned into an exit): the processes it
started (by process group), then the namespaces it made, which takes their veths, bridge
and qdiscs with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

import wan_figures  # noqa: E402
from swarmrl.identity import generate_key_file  # noqa: E402
from wan_netns import ROLES, SETUP_TIMEOUT, Network, can_run, tool  # noqa: E402

ORCH_PORT, ORIGIN_PORT, RELAY_PORT = 8700, 8800, 8801


@dataclass(frozen=True)
class Config:
    name: str
    mbit: int | None
    deltas: bool
    src: Path  # the swarmrl source tree the roles run
    origin: bool = False  # workers fetch from the origin too (shardcast.workers_fetch_origin)
    bf16: bool = False  # checkpoints broadcast rounded to bf16 (shardcast.dtype)


def parse_config(name: str, base_src: Path | None) -> Config:
    """RATE-MODE[-bf16][@base]: `-bf16` broadcasts checkpoints rounded to bf16; `@base`
    runs the roles from `--base-src` (the code before a change)."""
    spec, at, variant = name.partition("@")
    rate, _, rest = spec.partition("-")
    mode, _, precision = rest.partition("-")
    if (
        mode not in ("full", "delta", "origin")
        or precision not in ("", "bf16")
        or not (rate == "open" or rate.isdigit())
    ):
        raise SystemExit(
            f"bench_wan: configuration {name!r}: want RATE-MODE[-bf16], e.g. open-delta, "
            "20-full, 20-origin, 20-delta-bf16"
        )
    if at and (variant != "base" or base_src is None):
        raise SystemExit(f"bench_wan: configuration {name!r}: @base needs --base-src")
    src = base_src if at and base_src else ROOT / "src"
    return Config(
        name,
        None if rate == "open" else int(rate),
        mode != "full",
        src,
        origin=mode == "origin",
        bf16=precision == "bf16",
    )


class Processes:
    """The role processes of one run, each in its own process group."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, ns: str, cwd: Path, *args: str) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(self.src), "OMP_NUM_THREADS": "1"}
        with open(cwd / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "swarmrl", *args],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def stop(self, grace: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


class Key:
    """A role's key file and its address."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.address = generate_key_file(path).address


def served_bytes(net: Network, role: str, port: int) -> int | None:
    url = f"http://{net.ip(role)}:{port}/stats.json"
    got = tool("ip", "netns", "exec", net.ns(role), "curl", "-s", "-m", "5", url)
    try:
        return int(json.loads(got.stdout)["bytes_served"])
    except (ValueError, KeyError):
        return None


def run_once(net: Network, cfg: Config, keys: dict, model: str, base: Path, args) -> dict:
    """One configuration, start to finish; returns its figures."""
    net.cap(cfg.mbit)
    dirs = {r: base / r for r in ROLES}
    for d in dirs.values():
        d.mkdir(parents=True)
    run_toml = base / "run.toml"
    run_toml.write_text(
        f'run_name = "wan"\noutput_dir = "{dirs["trainer"] / "outputs"}"\n'
        "eval_before = false\neval_after = false\n"
        f"[trainer]\nsteps = {args.steps}\n[shardcast]\ndeltas = {str(cfg.deltas).lower()}\n"
        + ("workers_fetch_origin = true\n" if cfg.origin else "")
        + ('dtype = "bf16"\n' if cfg.bf16 else "")
        + "[pool]\nstake = 0\n"
    )
    orch = dirs["orch"]
    (orch / "allowlist").write_text(
        "".join(f"{keys[r].address} {r}\n" for r in ("trainer", "validator", "relay"))
    )
    url = f"http://{net.ip('orch')}:{ORCH_PORT}"
    origin = f"http://{net.ip('trainer')}:{ORIGIN_PORT}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmrl",
            "orchestrator",
            "--run-config",
            str(run_toml),
            "--ledger",
            f"sqlite:///{orch / 'ledger.db'}",
            "--store",
            str(orch / "rollouts"),
            "--secret-file",
            str(orch / "secret"),
            "--allowlist",
            str(orch / "allowlist"),
            "--write-config",
            str(orch / "orchestrator.toml"),
        ],
        check=True,
        timeout=4 * SETUP_TIMEOUT,  # imports on a loaded machine
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(cfg.src)},
    )
    procs = Processes(cfg.src)
    try:
        procs.start(
            "orchestrator",
            net.ns("orch"),
            orch,
            "orchestrator",
            "--config",
            str(orch / "orchestrator.toml"),
            "--host",
            net.ip("orch"),
            "--port",
            str(ORCH_PORT),
        )
        run_dir = dirs["trainer"] / "outputs" / "wan"
        procs.start(
            "origin",
            net.ns("trainer"),
            dirs["trainer"],
            "origin",
            "--root",
            str(run_dir / "shardcast" / "origin"),
            "--host",
            net.ip("trainer"),
            "--port",
            str(ORIGIN_PORT),
        )
        trainer = procs.start(
            "trainer",
            net.ns("trainer"),
            dirs["trainer"],
            "trainer",
            "--orchestrator",
            url,
            "--key",
            str(keys["trainer"].path),
            "--start-model",
            model,
            "--origin-url",
            origin,
            "--config",
            str(run_toml),
        )
        procs.start(
            "relay",
            net.ns("relay"),
            dirs["relay"],
            "relay",
            "--orchestrator",
            url,
            "--key",
            str(keys["relay"].path),
            "--upstream",
            origin,
            "--root",
            str(dirs["relay"] / "root"),
            "--host",
            net.ip("relay"),
            "--port",
            str(RELAY_PORT),
        )
        procs.start(
            "validator",
            net.ns("validator"),
            dirs["validator"],
            "validator",
            "--orchestrator",
            url,
            "--key",
            str(keys["validator"].path),
            "--config",
            str(run_toml),
        )
        for w in ("worker1", "worker2"):
            procs.start(
                w,
                net.ns(w),
                dirs[w],
                "worker",
                "--orchestrator",
                url,
                "--key",
                str(keys[w].path),
                "--workdir",
                str(dirs[w] / "work"),
                "--config",
                str(run_toml),
            )
        started = time.monotonic()
        while trainer.poll() is None:
            if time.monotonic() - started > args.run_timeout:
                raise TimeoutError(
                    f"{cfg.name}: the trainer did not finish in {args.run_timeout} s"
                )
            dead = [n for n, p in procs.procs.items() if p.poll() is not None and n != "trainer"]
            if dead:
                raise RuntimeError(f"{cfg.name}: {', '.join(dead)} exited early; logs in {base}")
            time.sleep(0.5)
        if trainer.returncode != 0:
            raise RuntimeError(
                f"{cfg.name}: the trainer exited {trainer.returncode}; see {dirs['trainer']}"
            )
        wall = time.monotonic() - started
        served = {
            "origin": served_bytes(net, "trainer", ORIGIN_PORT),
            "relay": served_bytes(net, "relay", RELAY_PORT),
        }
    finally:
        procs.stop()
    steps = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    with sqlite3.connect(orch / "ledger.db") as db:
        announced = dict(db.execute("SELECT step, announced_at FROM checkpoints").fetchall())
    workers = [
        wan_figures.parse_worker_log((dirs[w] / f"{w}.log").read_text())
        for w in ("worker1", "worker2")
    ]
    relay_held = wan_figures.parse_relay_log((dirs["relay"] / "relay.log").read_text())
    figures = wan_figures.run_figures(steps, announced, workers, relay_held, served)
    figures.update(config=cfg.name, wall_s=round(wall, 1), load_avg=os.getloadavg())
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--configs",
        default="open-full,open-delta,20-full,20-delta,100-full,100-delta",
        help="comma-separated RATE-MODE[-bf16]: RATE open or mbit, MODE full, delta or origin",
    )
    p.add_argument(
        "--key-configs",
        default="open-delta,20-full,20-delta",
        help="configurations run at least --key-repeats times",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs of every configuration")
    p.add_argument("--key-repeats", type=int, default=2, help="runs of each key configuration")
    p.add_argument("--steps", type=int, default=20, help="trainer steps per run")
    p.add_argument("--run-timeout", type=float, default=420, help="seconds one run may take")
    p.add_argument(
        "--keep", action="store_true", help="keep the run folders (logs) after the bench"
    )
    p.add_argument(
        "--base-src", type=Path, help="a swarmrl src/ folder that configurations NAME@base run"
    )
    p.add_argument("--json", type=Path, help="write every run and the summaries here")
    args = p.parse_args()
    configs = [parse_config(n, args.base_src) for n in args.configs.split(",")]
    key = set(args.key_configs.split(","))
    why = can_run()
    if why:
        print(f"bench_wan: skipped: {why}")
        return 0

    def leave(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, leave)
    tag = f"{os.getpid() % 100000:05d}"
    net = Network(tag, os.getpid() % 250)
    base = Path(tempfile.mkdtemp(prefix="bench_wan-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    runs: list[dict] = []
    try:
        model = subprocess.run(
            [sys.executable, "-m", "swarmrl", "init-model"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        ).stdout.strip()
        net.build()
        keys = {
            r: Key(base / f"{r}.key")
            for r in ("trainer", "relay", "validator", "worker1", "worker2")
        }
        rounds = max(args.repeats, args.key_repeats if key & {c.name for c in configs} else 0)
        for i in range(rounds):
            for cfg in configs:
                if i >= (max(args.repeats, args.key_repeats) if cfg.name in key else args.repeats):
                    continue
                print(f"[{time.strftime('%H:%M:%S')}] run {i + 1}: {cfg.name}", flush=True)
                try:
                    fig = run_once(net, cfg, keys, model, base / f"{cfg.name}-{i}", args)
                except (RuntimeError, TimeoutError, subprocess.SubprocessError) as exc:
                    # one run that fails (a role that died, a machine too loaded to finish
                    # in time) is reported and left out; the others still count
                    print(f"  failed: {exc}", flush=True)
                    runs.append({"config": cfg.name, "repeat": i, "failed": str(exc)})
                    continue
                fig["repeat"] = i
                runs.append(fig)
                if args.json:
                    args.json.write_text(json.dumps({"runs": runs, "steps": args.steps}, indent=1))
                print(
                    f"  idle {fig['trainer_idle']:.3f}, {fig['seconds_per_step']:.2f} s/step, "
                    f"wall {fig['wall_s']} s, load {fig['load_avg'][0]:.1f}",
                    flush=True,
                )
    finally:
        net.close()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    summaries = {
        c.name: wan_figures.config_summary(
            [r for r in runs if r["config"] == c.name and "failed" not in r]
        )
        for c in configs
    }
    print(wan_figures.table(summaries))
    if args.json:
        args.json.write_text(
            json.dumps({"runs": runs, "summaries": summaries, "steps": args.steps}, indent=1)
        )
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
