"""Shared fixtures: tiny real models built on the fly (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.model.build import WarmStartRecipe, build_default_model


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly warm-started embedded model (emits the worked format, often EOS)."""
    dest = tmp_path_factory.mktemp("models") / "tiny"
    return build_default_model(dest, WarmStartRecipe(steps=150, batch_size=32, lr=5e-3))
