"""Shared fixtures: tiny real models built on the fly (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmrl.model.build import WarmStartRecipe, build_default_model


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly warm-started embedded model (emits the worked format, often EOS)."""
    dest = tmp_path_factory.mktemp("models") / "tiny"
    # One thread: on a busy machine torch's second thread spins against the other
    # processes, and these small products run several times slower with it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_default_model(dest, WarmStartRecipe(steps=150, batch_size=32, lr=5e-3))
    finally:
        torch.set_num_threads(threads)
