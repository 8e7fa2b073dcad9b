"""Supervision of a running pool: the orchestrator's first answer, the trainer's long
waits, every slashing the orchestrator records, and the finish after the trainer is done."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from swarmrl.config import RunConfig
from swarmrl.display import StepDisplay
from swarmrl.protocol import models as api
from swarmrl.runfolder import RunFolder
from swarmrl.supervisor import Supervisor, SwarmError, tail
from swarmrl.trainer.metrics import read_metrics
from swarmrl.trainer.status import TrainerStatus

WAIT_REPORT_SECONDS = 60.0  # a trainer wait longer than this is reported, and then again
FINISH_TIMEOUT = {"validator": 120.0, "worker": 60.0}  # after the trainer is done
SLASHINGS_POLL_SECONDS = 3.0  # how often the console looks for new slashings
ORCHESTRATOR_START_SECONDS = 120.0  # the first answer of a freshly started orchestrator


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


def wait_report(
    folder: RunFolder, now: float, step: int, pool: api.StepStatus | None
) -> tuple[int, float, str] | None:
    """The trainer's wait for `step` (the next step to train) as (step, seconds waited,
    one line), or None when its status is about another step (a step whose samples were
    all there at once leaves the previous step's status in place) or being replaced.
    `pool` is the orchestrator's view of the step (None: it did not answer)."""
    status = TrainerStatus.read(folder.trainer_status)
    if status is None or status.step != step:
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
    waited = now - status.since
    return (
        step,
        waited,
        f"step {step}: {status.usable}/{status.needed} usable samples after {waited:.0f} s; {seen}",
    )


class SlashingWatch:
    """Follows the orchestrator's slashings and says each new one in one line, naming
    the run's process that was slashed."""

    def __init__(self, url: str, names: dict[str, str], say: Callable[[str], None]) -> None:
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
            f"caught {who} at {when} (step {s.step}) by the {api.failed_check(s.reason)} check: "
            f"{s.reason}; stake slashed {s.slashed:g}; {s.voided_files} file(s) voided"
            f"{tainted}; ejected"
        )


def supervise(
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
