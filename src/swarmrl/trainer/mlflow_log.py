"""MLflow tracking of a run: the trainer's step metrics and `swarmrl run`'s summary.

`--log.backend mlflow` makes the trainer log every numeric field of each step's record
as an MLflow metric at that step, and the run's configuration as parameters; `swarmrl
run` adds the summary's numbers (held-out accuracy before and after, ...) once the run
is evaluated. Where they go is `--log.uri`: an MLflow tracking server
(`http://host:5000`), or by default a SQLite store in the run folder,
`sqlite:///<run>/mlflow/mlflow.db`, which works offline (`mlflow ui --backend-store-uri
sqlite:///<run>/mlflow/mlflow.db` shows it). MLflow is not a dependency: `pip install -e
".[mlflow]"` brings in `mlflow-skinny`, imported only when this backend is chosen.

Both processes log into one MLflow run: its id is kept in `<run>/mlflow_run_id`, so a
trainer that resumes after a crash, and the summary at the end, continue the run the
trainer started instead of opening new ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUN_ID_FILE = "mlflow_run_id"
# MLflow refuses a parameter value over 6,000 characters; ours are config leaves.
_PARAM_CHARS = 500


def _mlflow():
    try:
        import mlflow
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "log.backend = mlflow needs MLflow: pip install -e '.[mlflow]' (mlflow-skinny)"
        ) from exc
    return mlflow


def tracking_uri(run_dir: Path, uri: str | None, folder: str | None) -> str:
    """`uri` when given; else a SQLite store in `folder` (default `<run>/mlflow`)."""
    if uri:
        return uri
    store = Path(folder) if folder else run_dir / "mlflow"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(store / 'mlflow.db').resolve()}"


def numeric(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a record, nested mappings as `outer.inner` (bools as 0/1);
    None, NaN, infinities, text and lists are left out."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(numeric(value, f"{prefix}{key}."))
            continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float) and math.isfinite(value):
            out[prefix + key] = float(value)
    return out


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested configuration as MLflow parameters, `section.field` = the value's text."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = str(value)[:_PARAM_CHARS]
    return out


class MlflowLog:
    """One MLflow run of a swarmrl run, opened or resumed through `<run>/mlflow_run_id`."""

    def __init__(
        self,
        run_dir: Path,
        uri: str,
        experiment: str,
        run_name: str,
        params: Mapping[str, str] | None = None,
    ):
        mlflow = _mlflow()
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self._entities = mlflow.entities
        id_file = run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else ""
        resumed = bool(run_id)
        if resumed:
            self.client.update_run(run_id, status="RUNNING")
        else:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found else self.client.create_experiment(experiment)
            )
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            id_file.write_text(run_id + "\n")
        self.run_id = run_id
        if params and not resumed:
            self._log_batch(params=[self._entities.Param(k, v) for k, v in sorted(params.items())])

    def _log_batch(self, metrics=(), params=()) -> None:
        # MLflow takes at most 1,000 metrics and 100 parameters in one batch.
        metrics, params = list(metrics), list(params)
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def add_scalars(self, step: int, scalars: Mapping[str, Any], prefix: str = "") -> None:
        """Every finite number of `scalars` as the metric `prefix + name` at `step`."""
        stamp = int(time.time() * 1000)
        self._log_batch(
            metrics=[
                self._entities.Metric(prefix + key, value, stamp, step)
                for key, value in numeric(scalars).items()
            ]
        )

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)
