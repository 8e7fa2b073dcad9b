"""Supervision of a run's processes: start each in its own session, restart the ones that
die, give up on one that keeps dying, and stop them all without leaving anything behind.

- Each process leads its own session (and so its own process group). Whatever it starts
  (a worker's proof process, multiprocessing's resource tracker) stays in that group, so
  one `killpg` reaches all of it, and a Ctrl-C in the terminal reaches only `swarmrl run`,
  which then stops the groups in order.
- A process that exits is reaped only after its group has been sent SIGKILL: the dead
  leader's pid still names the group then, so leftovers of a killed process (its proof
  process, say) cannot outlive it and the pid cannot have been reused.
- A worker the pool ejected (a rejected file slashed it) exits with `EXIT_EJECTED`: its
  job is over, and it is neither restarted nor counted as a failure.
- A role that exits non-zero (or a server role that exits at all) is restarted after a
  delay that doubles with each further failure within `window_seconds`, up to
  `backoff_max_seconds`. A role that has already been restarted `max_restarts` times
  within the window and fails again ends the run with its log tail.
- `stop()`: SIGTERM to every group, up to `stop_grace_seconds` for the leaders to exit,
  then SIGKILL to every group. `kill_all()` is the immediate form for a second Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.backoff import backoff_delay
from swarmrl.config import SupervisionConfig

# The exit code of a member the pool ejected: restarting it cannot help (the pool refuses
# everything it sends), and its exit is no failure of the run.
EXIT_EJECTED = 3


class SwarmError(RuntimeError):
    """A process of the swarm failed for good; the message carries its log tail."""


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the run: how to start it and whether its exit ends its job.

    Not a membership kind: what a key registers as is `protocol.models.Role`."""

    name: str
    args: list[str]  # after `python -m swarmrl`
    log: Path
    threads: int = 1
    # Trainer, workers and validator exit 0 when their job is done; a server role (relay)
    # runs until stopped, so any exit of it is a failure.
    finishes: bool = True


@dataclass
class _Running:
    role: ProcessSpec
    proc: subprocess.Popen | None
    started: float
    restarts: list[float] = field(default_factory=list)  # times of this role's restarts
    restart_at: float | None = None  # a restart waiting out its backoff
    done: bool = False


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the process has exited, without reaping it (its pid keeps naming its group)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is empty
        os.killpg(proc.pid, sig)


class Supervisor:
    """Starts, watches, restarts and stops the named processes of one run."""

    def __init__(
        self,
        policy: SupervisionConfig,
        pids_path: Path,
        notify: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.pids_path = pids_path
        self.notify = notify
        self.clock = clock
        self.roles: dict[str, _Running] = {}
        # CPU-seconds of each role's processes that have exited (restarts add up)
        self.cpu_seconds: dict[str, float] = {}
        self.ejected: set[str] = set()  # roles that exited with EXIT_EJECTED
        self.stopping = False
        # A signal handler that would raise while a process is being started and
        # recorded (leaving a process nobody stops) defers the signal here instead.
        self.spawning = False
        self.deferred_signal: int | None = None

    @contextlib.contextmanager
    def _spawning(self) -> Iterator[None]:
        self.spawning = True
        try:
            yield
        finally:
            self.spawning = False
        if self.deferred_signal is not None:
            signum, self.deferred_signal = self.deferred_signal, None
            signal.raise_signal(signum)  # delivered again, now that the process is recorded

    def start(self, role: ProcessSpec) -> None:
        with self._spawning():
            self.roles[role.name] = _Running(role, self._spawn(role), self.clock())
        self._write_pids()

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts per role so far (roles never restarted are left out)."""
        return {name: len(r.restarts) for name, r in self.roles.items() if r.restarts}

    def exited(self, name: str) -> int | None:
        """The exit code of a role that finished its job, else None."""
        running = self.roles[name]
        return running.proc.returncode if running.done and running.proc else None

    def poll(self) -> None:
        """Reap the processes that exited, schedule or run their restarts; raises
        SwarmError when a role has failed more often than the policy allows."""
        now = self.clock()
        for name, running in self.roles.items():
            proc = running.proc
            if proc is not None and not running.done and _exited(proc):
                _signal_group(proc, signal.SIGKILL)  # its leftovers go with it
                code = self._reap(name, proc)
                if code == 0 and running.role.finishes:
                    running.done = True
                    continue
                if code == EXIT_EJECTED and running.role.finishes:
                    running.done = True
                    self.ejected.add(name)
                    self.notify(f"{name} was ejected by the pool; it is not restarted")
                    continue
                running.proc = None
                self._failed(running, code, now)
            if (
                running.proc is None
                and running.restart_at is not None
                and now >= running.restart_at
            ):
                running.restart_at = None
                running.restarts.append(now)
                with self._spawning():
                    running.proc = self._spawn(running.role)
                running.started = now
                self._write_pids()
                self.notify(
                    f"{name} restarted ({len(running.restarts)} restart(s) so far; log {running.role.log})"
                )

    def _failed(self, running: _Running, code: int, now: float) -> None:
        role, policy = running.role, self.policy
        recent = [t for t in running.restarts if now - t < policy.window_seconds]
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        if len(recent) >= policy.max_restarts:
            raise SwarmError(
                f"{role.name} {how} after {len(recent)} restart(s) in the last "
                f"{policy.window_seconds:.0f} s (supervision.max_restarts {policy.max_restarts}); "
                f"last lines of {role.log}:\n{tail(role.log)}"
            )
        delay = backoff_delay(len(recent) + 1, policy.backoff_seconds, policy.backoff_max_seconds)
        running.restart_at = now + delay
        self.notify(f"{role.name} {how}; restarting it in {delay:.1f} s")

    def stop(self) -> None:
        """SIGTERM every process group, wait up to the grace period, then SIGKILL them all."""
        self.stopping = True
        live = {
            name: r.proc
            for name, r in self.roles.items()
            if r.proc is not None and r.proc.returncode is None
        }
        for proc in live.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.policy.stop_grace_seconds
        while time.monotonic() < deadline and not all(_exited(p) for p in live.values()):
            time.sleep(0.05)
        for name, proc in live.items():
            _signal_group(proc, signal.SIGKILL)
            self._reap(name, proc)
        for running in self.roles.values():
            running.restart_at = None

    def _reap(self, name: str, proc: subprocess.Popen) -> int:
        """Wait for `proc` (role `name`), add the CPU-seconds (user + system) it and the
        descendants it waited for used to the role's, and return its exit code."""
        if proc.returncode is None:
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except ChildProcessError:  # reaped elsewhere: Popen knows no more than we do
                return proc.wait()
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.cpu_seconds[name] = (
                self.cpu_seconds.get(name, 0.0) + usage.ru_utime + usage.ru_stime
            )
        return proc.returncode

    def kill_all(self) -> int:
        """SIGKILL every process group at once; returns how many were still running."""
        live = [
            r.proc for r in self.roles.values() if r.proc is not None and r.proc.returncode is None
        ]
        for proc in live:
            _signal_group(proc, signal.SIGKILL)
        return sum(not _exited(p) for p in live)

    def alive(self) -> list[str]:
        return [
            name
            for name, r in self.roles.items()
            if r.proc is not None and r.proc.returncode is None and not _exited(r.proc)
        ]

    def _spawn(self, role: ProcessSpec) -> subprocess.Popen:
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(role.threads),
            MKL_NUM_THREADS=str(role.threads),
            PYTHONUNBUFFERED="1",
        )
        role.log.parent.mkdir(parents=True, exist_ok=True)
        with open(role.log, "ab") as log:  # the child holds its own copy of the descriptor
            return subprocess.Popen(
                [sys.executable, "-m", "swarmrl", *role.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def _write_pids(self) -> None:
        """`processes.json`: each role's pid (its process group) and restarts, for a user
        (or a test) who wants to find the run's processes."""
        record = {
            name: {"pid": r.proc.pid if r.proc else None, "restarts": len(r.restarts)}
            for name, r in self.roles.items()
        }
        tmp = self.pids_path.with_name(f".{self.pids_path.name}.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.pids_path)
