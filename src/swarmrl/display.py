"""What `swarmrl run` shows while it works: step n/N, elapsed time and ETA, the step's
metrics, the trainer's waits and the evaluation's count.

In a terminal: a live bar whose first line (`GRPO ━━━━ step 8/50 0:01:23 ETA 0:04:10`)
fits in 80 columns, with the metrics on a line of their own below it. Without one (a
log file, CI): one unwrapped line per step instead, and every other message on one line.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from swarmrl.trainer.metrics import StepMetrics


def clock(seconds: float | None) -> str:
    """`1:02:03` / `2:03`, or `--:--` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta_seconds(records: list[StepMetrics], total: int) -> float | None:
    """Remaining steps times the median wall time between the last few steps."""
    done = records[-1].step + 1 if records else 0
    times = [r.time for r in records[-11:]]
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= a]
    if not gaps:
        return None
    return max(0, total - done) * statistics.median(gaps)


def metrics_line(m: StepMetrics) -> str:
    """The step's figures in under 80 columns."""
    length = "" if m.length_error != m.length_error else f" len-err {m.length_error:.1f}"
    return (
        f"reward {m.reward:+.3f} task {m.task_reward:.2f}{length} grad {m.grad_norm:.2f} "
        f"clip {m.clip_ratio:.2f} stale {m.staleness_mean:.1f} wait {m.wait_seconds:.1f}s"
    )


class _TwoLineProgress(Progress):
    """A progress bar with a free text line under it (the metrics)."""

    below = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.below:
            yield Text(self.below, no_wrap=True, overflow="ellipsis")


class StepDisplay:
    """Live training progress; `update` with the metrics so far, `say` for a message."""

    def __init__(self, console: Console, total: int, started: float, shown: int = -1) -> None:
        """`shown`: the last step already trained when the display starts (a resumed
        run's earlier steps are not printed again)."""
        self.console = console
        self.total = total
        self.started = started
        self.shown = shown
        self.live = console.is_terminal
        self.progress = _TwoLineProgress(
            TextColumn("[bold]GRPO"),
            BarColumn(bar_width=20),
            TextColumn("step {task.completed}/{task.total}"),
            TextColumn("{task.fields[elapsed]}"),
            TextColumn("ETA {task.fields[eta]}"),
            console=console,
            auto_refresh=True,
        )
        self.bar = self.progress.add_task("train", total=total, elapsed="0:00", eta="--:--")

    def __enter__(self) -> StepDisplay:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def say(self, message: str) -> None:
        """One line above the bar (or in the log), never wrapped."""
        self.console.print(message, soft_wrap=True, markup=False, highlight=False)

    def update(self, records: list[StepMetrics]) -> None:
        elapsed = clock(time.time() - self.started)
        eta = clock(eta_seconds(records, self.total))
        done = records[-1].step + 1 if records else 0
        self.progress.update(self.bar, completed=done, elapsed=elapsed, eta=eta)
        if records:
            self.progress.below = metrics_line(records[-1])
        if not self.live:
            for record in records:
                if record.step > self.shown:
                    self.say(
                        f"step {record.step + 1}/{self.total} elapsed {elapsed} ETA {eta} "
                        + metrics_line(record)
                    )
        if records:
            self.shown = max(self.shown, records[-1].step)


@contextmanager
def counted(console: Console, what: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """A bar with a count (`evaluating checkpoint 50 ━━━━ 128/256`); yields
    `advance(done, total)`. Without a terminal, one line when it starts."""
    progress = Progress(
        TextColumn(what),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task(what, total=total)
    if not console.is_terminal:
        console.print(f"{what} ({total} problems)", soft_wrap=True, markup=False)

        def quiet(done: int, total: int) -> None:
            return None

        yield quiet
        return
    with progress:

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield advance
