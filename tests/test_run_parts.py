"""`swarmrl run`'s parts on their own: a worker's command line, the trainer's status file,
the summary's cheaters and the ledger's upload totals."""

from __future__ import annotations

import json

from swarmrl.config import load_config
from swarmrl.ledger import Ledger, upload_totals
from swarmrl.run.launch import worker_role
from swarmrl.run.summary import Cheater
from swarmrl.trainer.status import TrainerStatus


def _cfg(tmp_path):
    return load_config(overrides={"output_dir": str(tmp_path / "out"), "run_name": "p"})


def test_an_honest_worker_and_a_copier_differ_only_in_their_cheat(tmp_path):
    cfg = _cfg(tmp_path)
    folder = cfg.folder
    honest = worker_role(cfg, "worker-0", folder.worker_dir(0), "http://o", tmp_path / "k0")
    copier = worker_role(
        cfg, "adversary-copy", folder.adversary_dir("copy"), "http://o", tmp_path / "k1", "copy"
    )
    assert honest.args == [
        "worker",
        "--config",
        str(folder.config),
        "--orchestrator",
        "http://o",
        "--key",
        str(tmp_path / "k0"),
        "--workdir",
        str(folder.worker_dir(0)),
    ]
    assert copier.args[-4:] == ["--adversary", "copy", "--copy-from", str(folder.store.resolve())]
    other = worker_role(
        cfg, "adversary-noise", folder.adversary_dir("noise"), "http://o", tmp_path / "k2", "noise"
    )
    assert other.args[-2:] == ["--adversary", "noise"]


def test_the_trainer_status_reads_back_what_was_written(tmp_path):
    path = tmp_path / "trainer_status.json"
    assert TrainerStatus.read(path) is None
    TrainerStatus(step=3, usable=10, needed=64, since=12.5).write(path)
    assert json.loads(path.read_text()) == {"step": 3, "usable": 10, "needed": 64, "since": 12.5}
    assert TrainerStatus.read(path) == TrainerStatus(step=3, usable=10, needed=64, since=12.5)
    path.write_text('{"step": 3')  # cut short
    assert TrainerStatus.read(path) is None


def test_an_uncaught_cheater_lists_no_catch_fields():
    cheater = Cheater(
        name="adversary-copy",
        kind="copy",
        address="0xabc",
        caught=False,
        ejected=False,
        stopped_on_ejection=False,
    )
    assert cheater.model_dump(exclude_none=True) == {
        "name": "adversary-copy",
        "kind": "copy",
        "address": "0xabc",
        "caught": False,
        "ejected": False,
        "stopped_on_ejection": False,
    }


def test_an_empty_ledger_counts_no_uploads(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.session() as session:
            totals = upload_totals(session)
    finally:
        ledger.close()
    assert (totals.files, totals.samples, totals.files_trained) == (0, 0, 0)
