"""Shared fixtures: tiny real models built on the fly (no downloads), and the suite's
order: the slow tests start first.

Under pytest-xdist (`--dist load --maxschedchunk 1`, see pyproject.toml) each worker
takes the next test as it frees up, so the wall time is set by whichever worker finishes
last. Started first, the minute-long whole-swarm tests overlap each other and the many
short tests fill in behind them; collected in file order they would come last and leave
one worker running the chaos test alone. An expensive result that tests on different
workers share is built once per run by `helpers.built_once`. (`xdist_group` cannot do
it here: xdist 3.8 tags grouped tests through `Node._nodeid`, which pytest 9.2 no
longer reads, so the groups are silently ignored.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from helpers import WARM_MODEL_FLAGS, built_once
from swarmrl.model.build import WarmStartRecipe, ensure_default_model, is_cached
from swarmrl.runfolder import RunFolder

# A brief warm start: the embedded model's architecture, fewer steps and a higher rate.
WARM_RECIPE = WarmStartRecipe(steps=150, batch_size=32, lr=5e-3)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the two embedded models the suite runs on, where the cache lacks them, once
    and before any test starts: in the xdist controller before its workers start (or in
    the one process without xdist). Built inside a test they shared the two cores with
    the other worker's swarms, and the default model's 500 steps (about 2 to 6 minutes
    alone, by processor) could pass the 600 s test timeout."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller built them
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for name, recipe in (
        ("the embedded default model", WarmStartRecipe()),
        ("the test model", WARM_RECIPE),
    ):
        if is_cached(recipe):
            continue
        if reporter is not None:
            reporter.write_line(
                f"building {name} once (kept in the model cache for later runs) ..."
            )
        started = time.monotonic()
        ensure_default_model(recipe=recipe)
        if reporter is not None:
            reporter.write_line(f"built {name} in {time.monotonic() - started:.0f} s")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: the slow tests first, each layer in collection order.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def warm_model_dir() -> Path:
    """A briefly warm-started embedded model (emits the worked format, often EOS).

    Kept in the model cache `swarmrl run` uses ($SWARMRL_CACHE or ~/.cache/swarmrl),
    under its recipe's name: the xdist workers and later runs share one build (about
    35 s on a loaded 2-core machine) instead of each making its own."""
    # One thread: on a busy machine torch's second thread spins against the other
    # processes, and these small products run several times slower with it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return ensure_default_model(recipe=WARM_RECIPE)
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class CheatersRun:
    """A finished `swarmrl run --adversary` with two cheaters (see `two_cheaters_run`)."""

    out: Path
    kinds: tuple[str, ...]
    returncode: int
    stderr: str

    @property
    def run(self) -> RunFolder:
        return RunFolder(self.out / "a")


CHEATER_KINDS = ("wrong_model", "inflated_rewards")


def _run_two_cheaters(folder: Path, model: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmrl",
            "run",
            "--model.path",
            str(model),
            "--output_dir",
            str(folder / "outputs"),
            "--run_name",
            "a",
            "--adversary",
            ",".join(CHEATER_KINDS),
            "--worker.count",
            "2",
            "--trainer.steps",
            "3",
            "--trainer.batch_samples",
            "16",
            "--worker.prompts_per_file",
            "2",
            "--sampling.group_size",
            "4",
            "--eval_before",
            "false",
            # The final checkpoint on a small held-out split: the dashboard shows the result.
            "--eval_after",
            "true",
            "--task.eval_size",
            "32",
            *WARM_MODEL_FLAGS,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    (folder / "returncode").write_text(str(proc.returncode))
    (folder / "stderr").write_text(proc.stderr)


@pytest.fixture(scope="session")
def two_cheaters_run(tmp_path_factory, warm_model_dir) -> CheatersRun:
    """`swarmrl run --adversary wrong_model,inflated_rewards`: 2 honest workers and 2
    cheaters, 3 steps, run once per test run (`built_once`) and read by the adversary
    test and the dashboard's browser test; neither may change its folder."""
    folder = built_once(
        tmp_path_factory, "two-cheaters-run", lambda f: _run_two_cheaters(f, warm_model_dir)
    )
    return CheatersRun(
        out=folder / "outputs",
        kinds=CHEATER_KINDS,
        returncode=int((folder / "returncode").read_text()),
        stderr=(folder / "stderr").read_text(),
    )
