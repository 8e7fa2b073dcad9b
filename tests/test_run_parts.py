"""`swarmrl run`'s parts on their own: the trainer's status file and the ledger's upload
totals."""

from __future__ import annotations

import json

from swarmrl.ledger import Ledger, upload_totals
from swarmrl.trainer.status import TrainerStatus


def test_the_trainer_status_reads_back_what_was_written(tmp_path):
    path = tmp_path / "trainer_status.json"
    assert TrainerStatus.read(path) is None
    TrainerStatus(step=3, usable=10, needed=64, since=12.5).write(path)
    assert json.loads(path.read_text()) == {"step": 3, "usable": 10, "needed": 64, "since": 12.5}
    assert TrainerStatus.read(path) == TrainerStatus(step=3, usable=10, needed=64, since=12.5)
    path.write_text('{"step": 3')  # cut short
    assert TrainerStatus.read(path) is None


def test_an_empty_ledger_counts_no_uploads(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.session() as session:
            totals = upload_totals(session)
    finally:
        ledger.close()
    assert (totals.files, totals.samples, totals.files_trained) == (0, 0, 0)
