"""Where the trainer's step metrics go besides `metrics.jsonl` and the dashboard:
`--log.backend` off (default), tensorboard (event files) or mlflow (a tracking store)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from swarmrl.config import RunConfig


class MetricsSink(Protocol):
    def add_scalars(self, step: int, scalars: Mapping[str, Any], prefix: str = "") -> None: ...

    def finish(self) -> None: ...


def open_sink(cfg: RunConfig, run_dir: Path) -> MetricsSink | None:
    """The configured backend's writer for this run, or None when it is off."""
    if cfg.log.backend == "tensorboard":
        from swarmrl.trainer.tensorboard import EventFileWriter

        return EventFileWriter(Path(cfg.log.dir) if cfg.log.dir else run_dir / "tensorboard")
    if cfg.log.backend == "mlflow":
        return open_mlflow(cfg, run_dir, with_params=True)
    return None


def open_mlflow(cfg: RunConfig, run_dir: Path, with_params: bool = False):
    """The run's MLflow run (created on the first call, resumed on later ones)."""
    from swarmrl.trainer.mlflow_log import MlflowLog, flat_params, tracking_uri

    return MlflowLog(
        run_dir,
        tracking_uri(run_dir, cfg.log.uri, cfg.log.dir),
        cfg.log.experiment,
        cfg.run_name,
        flat_params(cfg.model_dump(mode="json")) if with_params else None,
    )
