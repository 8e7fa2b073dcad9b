"""Open a ledger by URL and bring its schema to the newest migration.

`sqlite:///path/ledger.db` (the default) or `postgresql+psycopg://user@host/db`. The
Alembic migrations ship inside the package and run on every start, so an older
ledger is upgraded in place and a new one is created from nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

# Alembic announces each plugin and migration at INFO: noise in every role's log.
logging.getLogger("alembic").setLevel(logging.WARNING)


class LedgerError(RuntimeError):
    """The ledger URL is unusable or its database cannot be reached."""


def _engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise LedgerError(f"ledger URL {url!r} is not a database URL ({exc})") from None
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3, not psycopg2
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            # WAL: readers never block the writer; foreign keys are off by default in SQLite.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(parsed, pool_pre_ping=True)


def _migrations() -> str:
    """The folder of the migrations shipped with this package."""
    return str(resources.files("swarmrl.ledger") / "migrations")


def migrate(engine: Engine) -> None:
    """Upgrade the ledger's schema to the newest migration shipped with this package."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", _migrations())
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def schema_behind(engine: Engine) -> str | None:
    """None when the ledger's schema is this package's newest, else what it is and needs."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(_migrations())
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_heads()
    heads = tuple(script.get_heads())
    if set(current) == set(heads):
        return None
    return (
        f"its schema is at {', '.join(current) or 'nothing'}, this swarmrl's at {', '.join(heads)}"
    )


def _sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (None for another database or `:memory:`)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # `_engine` says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


class Ledger:
    """A migrated ledger database and a session factory for it.

    A SQLite ledger's folder is created when missing (`create`), so a first start in an
    empty folder works; `create=False` opens an existing ledger as it is: it refuses a
    ledger file that does not exist (a check must not make an empty ledger and call it
    consistent) and one whose schema is not this package's newest (a check must not
    migrate the ledger of a running orchestrator under it)."""

    def __init__(self, url: str, create: bool = True) -> None:
        self.url = url
        path = _sqlite_file(url)
        if path is not None and not create and not path.is_file():
            raise LedgerError(f"no ledger at {url}: {path} does not exist")
        if path is not None and create:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = _engine(url)
        try:
            if create:
                migrate(self.engine)
            elif (behind := schema_behind(self.engine)) is not None:
                raise LedgerError(
                    f"the ledger at {make_url(url).render_as_string(hide_password=True)} "
                    f"was not written by this version of swarmrl: {behind}"
                )
        except OperationalError as exc:
            raise LedgerError(
                f"cannot open the ledger at {make_url(url).render_as_string(hide_password=True)}: "
                f"{exc.orig}"
            ) from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._sessions.begin() as session:
            yield session

    def close(self) -> None:
        self.engine.dispose()
