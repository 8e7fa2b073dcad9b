"""The ledger: migrations build exactly the models' schema, on SQLite and PostgreSQL, and
the consistency check catches every kind of lost or double-counted record."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from pool_fixtures import BACKENDS, ledger_url_for
from swarmrl.ledger import (
    Account,
    Assignment,
    Base,
    Contribution,
    JournalEntry,
    Ledger,
    LedgerError,
    Member,
    Nonce,
    Slashing,
    Submission,
    Verdict,
    check_ledger,
)


@pytest.fixture(params=BACKENDS)
def ledger(request, tmp_path):
    opened = Ledger(ledger_url_for(request.param, tmp_path))
    yield opened
    opened.close()


def test_migrations_build_the_models_schema(ledger):
    with ledger.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    tables = set(inspect(ledger.engine).get_table_names())
    assert tables == set(Base.metadata.tables) | {"alembic_version"}


def test_reopening_migrates_nothing_and_keeps_rows(ledger):
    with ledger.session() as s:
        s.add(
            Member(
                address="0x" + "1" * 40,
                role="worker",
                status="healthy",
                registered_at=1.0,
                lapses=0,
            )
        )
    again = Ledger(ledger.url)
    try:
        with again.session() as s:
            assert s.scalars(select(Member.address)).all() == ["0x" + "1" * 40]
    finally:
        again.close()


def test_sqlite_ledger_is_wal_and_keeps_a_commit_through_kill_9(tmp_path):
    """WAL with synchronous=NORMAL: a commit is in the log file before it returns, so a
    process killed right after (kill -9) loses nothing; only an OS crash or power loss may
    drop the newest commits. A spent nonce must survive the kill for the replay check."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from swarmrl.ledger import Ledger, Nonce\n"
            "ledger = Ledger(sys.argv[1])\n"
            "with ledger.session() as s:\n"
            "    s.add(Nonce(address='0x' + '2' * 40, nonce='ab' * 16, timestamp=1))\n"
            "print('committed', flush=True)\n"
            "time.sleep(60)\n",
            url,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "committed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    ledger = Ledger(url)
    try:
        with ledger.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        with ledger.session() as s:
            assert s.scalars(select(Nonce.nonce)).all() == ["ab" * 16]
    finally:
        ledger.close()


def test_unreachable_or_malformed_ledger_url_is_a_clear_error(tmp_path):
    with pytest.raises(LedgerError, match="not a database URL"):
        Ledger("no such thing")
    with pytest.raises(LedgerError, match="cannot open the ledger"):
        Ledger("postgresql://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(LedgerError) as info:
        Ledger("postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(info.value)  # the password is not echoed


WORKER = "0x" + "a" * 40
VALIDATOR = "0x" + "b" * 40


def _healthy_ledger(s) -> None:
    """Two assignments: one returned with an accepted, credited, trained file; one open."""
    for address, role in ((WORKER, "worker"), (VALIDATOR, "validator")):
        s.add(Member(address=address, role=role, status="healthy", registered_at=0.0, lapses=0))
    s.flush()
    for i, state in ((1, "returned"), (2, "issued")):
        s.add(
            Assignment(
                id=i,
                worker=WORKER,
                step=0,
                seed=i,
                prompts=2,
                group_size=2,
                state=state,
                issued_at=0.0,
                deadline=10.0,
            )
        )
    s.flush()
    s.add(
        Submission(
            file_hash="f" * 64,
            assignment_id=1,
            worker=WORKER,
            step=0,
            stored_name="step_000000/" + "f" * 64 + ".parquet",
            size=10,
            num_samples=4,
            num_nonzero=4,
            num_tokens=8,
            state="accepted",
            to_validate=True,
            uploaded_at=1.0,
            trained_step=0,
        )
    )
    s.flush()
    s.add(
        Verdict(
            file_hash="f" * 64,
            validator=VALIDATOR,
            accepted=True,
            reason="",
            body="{}",
            signed_text="",
            signature="0x",
            decided_at=2.0,
        )
    )
    s.add(
        Contribution(
            file_hash="f" * 64,
            worker=WORKER,
            step=0,
            samples=4,
            tokens=8,
            credited_at=2.0,
            paid_at=3.0,
            amount=4 * NANO,
        )
    )
    # Funded 10, staked 5, paid 4 for the file: balance 9, stake 5.
    s.add(Account(address=WORKER, balance=9 * NANO, stake=5 * NANO))
    for kind, amount, file_hash in (
        ("fund", 10 * NANO, None),
        ("stake", 5 * NANO, None),
        ("payout", 4 * NANO, "f" * 64),
    ):
        s.add(JournalEntry(at=1.0, kind=kind, address=WORKER, amount=amount, file_hash=file_hash))


NANO = 10**9


def _break(s, fault: str) -> None:
    sub = s.get(Submission, "f" * 64)
    if fault == "returned without a submission":
        s.get(Assignment, 2).state = "returned"
    elif fault == "has a submission but is lapsed":
        s.get(Assignment, 1).state = "lapsed"
    elif fault == "is not credited":
        s.delete(s.get(Contribution, "f" * 64))
    elif fault == "is credited with other numbers":
        s.get(Contribution, "f" * 64).samples = 8
    elif fault == "rejected against its verdict":
        sub.state = "rejected"
        s.delete(s.get(Contribution, "f" * 64))
    elif fault == "rejected submission":
        s.get(Verdict, "f" * 64).accepted = False
        sub.state = "rejected"
        s.delete(s.get(Contribution, "f" * 64))
    elif fault == "does not match assignment":
        sub.step = 1
    elif fault == "has a verdict but is still pending":
        sub.state = "pending"
        s.delete(s.get(Contribution, "f" * 64))
    elif fault == "the books do not add up":
        s.get(Account, WORKER).balance += 1
    elif fault == "paid mark and journal disagree":
        s.get(Contribution, "f" * 64).paid_at = None
    elif fault == "without a rejected verdict":
        s.add(
            Slashing(
                file_hash="f" * 64,
                address=WORKER,
                step=0,
                at=4.0,
                reason="",
                amount=0,
                voided_files=0,
                tainted_files=0,
            )
        )
        s.add(JournalEntry(at=4.0, kind="slash", address=WORKER, amount=0, file_hash="f" * 64))
    elif fault == "was trained before its verdict":
        s.delete(s.get(Verdict, "f" * 64))
        sub.state = "pending"
    elif fault == "forfeited by a member in good standing":
        s.get(Contribution, "f" * 64).forfeited_at = 4.0
    elif fault == "ejected without a slashing":
        s.get(Member, WORKER).ejected_at = 4.0


FAULTS = [
    "returned without a submission",
    "has a submission but is lapsed",
    "is not credited",
    "is credited with other numbers",
    "rejected against its verdict",
    "rejected submission",
    "does not match assignment",
    "has a verdict but is still pending",
    "the books do not add up",
    "paid mark and journal disagree",
    "without a rejected verdict",
    "was trained before its verdict",
    "forfeited by a member in good standing",
    "ejected without a slashing",
]


@pytest.mark.parametrize("fault", FAULTS)
def test_consistency_check_finds_each_fault(ledger, fault):
    with ledger.session() as s:
        _healthy_ledger(s)
    with ledger.session() as s:
        assert check_ledger(s) == []
        _break(s, fault)
        s.flush()
        problems = check_ledger(s)
    assert any(fault in p for p in problems), problems


def test_constraints_refuse_double_counting(ledger):
    from sqlalchemy.exc import IntegrityError

    with ledger.session() as s:
        _healthy_ledger(s)
    # A second submission for the same assignment, or a second credit for one file.
    with pytest.raises(IntegrityError), ledger.session() as s:
        s.add(
            Submission(
                file_hash="e" * 64,
                assignment_id=1,
                worker=WORKER,
                step=0,
                stored_name="step_000000/" + "e" * 64 + ".parquet",
                size=10,
                num_samples=4,
                num_nonzero=4,
                num_tokens=8,
                state="pending",
                to_validate=False,
                uploaded_at=1.0,
            )
        )
    with pytest.raises(IntegrityError), ledger.session() as s:
        s.add(
            Contribution(
                file_hash="f" * 64, worker=WORKER, step=0, samples=4, tokens=8, credited_at=3.0
            )
        )
    with pytest.raises(IntegrityError), ledger.session() as s:
        s.get(Submission, "f" * 64).state = "lost"
    # A second payout for one file.
    with pytest.raises(IntegrityError), ledger.session() as s:
        s.add(JournalEntry(at=5.0, kind="payout", address=WORKER, amount=1, file_hash="f" * 64))
    with ledger.session() as s:
        assert check_ledger(s) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_migration_0003_upgrades_a_0002_ledger_in_place(tmp_path, backend):
    from importlib import resources

    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine, text

    url = ledger_url_for(backend, tmp_path)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    config = Config()
    config.set_main_option("script_location", str(resources.files("swarmrl.ledger") / "migrations"))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0002")
        # A ledger as the previous version left it: an accepted, credited file.
        for sql in (
            f"INSERT INTO members VALUES ('{WORKER}', 'worker', 'healthy', NULL, 0, 0)",
            f"INSERT INTO members VALUES ('{VALIDATOR}', 'validator', 'healthy', NULL, 0, 0)",
            f"INSERT INTO assignments VALUES (1, '{WORKER}', 0, 7, 2, 2, 'returned', 0, 10, 1)",
            "INSERT INTO submissions (file_hash, assignment_id, worker, step, stored_name, size, "
            "num_samples, num_nonzero, num_tokens, state, to_validate, uploaded_at, counted) "
            f"VALUES ('{'f' * 64}', 1, '{WORKER}', 0, 'x.parquet', 10, 4, 4, 8, 'accepted', "
            "true, 1, false)",
            f"INSERT INTO verdicts VALUES ('{'f' * 64}', '{VALIDATOR}', true, '', '{{}}', '', "
            "'0x', 2)",
            f"INSERT INTO contributions VALUES ('{'f' * 64}', '{WORKER}', 0, 4, 8, 2)",
        ):
            conn.execute(text(sql))
    engine.dispose()
    upgraded = Ledger(url)
    try:
        with upgraded.session() as s:
            assert s.get(Verdict, "f" * 64).soft is False
            c = s.get(Contribution, "f" * 64)
            assert (c.samples, c.paid_at, c.forfeited_at) == (4, None, None)  # paid later
            assert s.get(Member, WORKER).ejected_at is None
            assert check_ledger(s) == []
        with upgraded.engine.connect() as conn:
            newest = ScriptDirectory.from_config(config).get_current_head()
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == newest
    finally:
        upgraded.close()
