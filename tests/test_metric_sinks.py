"""What the metrics backends are given: the finite numbers of a record, the config as
flat parameters, and the default MLflow store inside the run folder."""

from __future__ import annotations

import math

from swarmrl.config import load_config
from swarmrl.trainer.mlflow_log import flat_params, numeric, tracking_uri
from swarmrl.trainer.sinks import open_sink
from swarmrl.trainer.tensorboard import EventFileWriter


def test_numeric_keeps_finite_numbers_and_flattens_mappings():
    record = {
        "reward": 0.5,
        "samples": 128,
        "finished": True,
        "length_error": math.nan,
        "grad_norm": math.inf,
        "run": "text",
        "ledger_problems": ["x"],
        "clip_ratio": None,
        "bytes_served": {"origin": 10, "relay-1": None, "deep": {"x": 2.0}},
    }
    assert numeric(record) == {
        "reward": 0.5,
        "samples": 128.0,
        "finished": 1.0,
        "bytes_served.origin": 10.0,
        "bytes_served.deep.x": 2.0,
    }


def test_the_config_becomes_dotted_parameters():
    cfg = load_config(None, {"trainer.lr": 3e-5})
    params = flat_params(cfg.model_dump(mode="json"))
    assert params["trainer.lr"] == "3e-05"
    assert params["log.backend"] == "off"
    assert all(len(v) <= 500 for v in params.values())


def test_the_default_store_is_sqlite_in_the_run_folder(tmp_path):
    assert tracking_uri(tmp_path, "http://mlflow:5000", None) == "http://mlflow:5000"
    uri = tracking_uri(tmp_path, None, None)
    assert uri == f"sqlite:///{(tmp_path / 'mlflow' / 'mlflow.db').resolve()}"
    assert (tmp_path / "mlflow").is_dir()
    assert tracking_uri(tmp_path, None, str(tmp_path / "elsewhere")).endswith(
        "/elsewhere/mlflow.db"
    )


def test_open_sink_follows_the_backend(tmp_path):
    assert open_sink(load_config(None), tmp_path) is None
    board = open_sink(load_config(None, {"log.backend": "tensorboard"}), tmp_path)
    assert isinstance(board, EventFileWriter) and board.path.parent == tmp_path / "tensorboard"
