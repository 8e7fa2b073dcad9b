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

from pathlib import Path

import pytest
import torch

from swarmrl.model.build import WarmStartRecipe, ensure_default_model

# A brief warm start: the embedded model's architecture, fewer steps and a higher rate.
WARM_RECIPE = WarmStartRecipe(steps=150, batch_size=32, lr=5e-3)


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
