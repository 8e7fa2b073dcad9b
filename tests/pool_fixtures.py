"""Shared helpers for the pool tests: a real orchestrator on a loopback port, members with
real keys, real rollout files, and raw signed requests for forging.

The ledger runs on SQLite, and also on PostgreSQL when SWARMRL_TEST_POSTGRES_URL names
a server (`.ci/postgres.sh` starts one); each PostgreSQL test gets an empty schema.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.ledger import Ledger, check_ledger, snapshot
from swarmrl.orchestrator import OrchestratorConfig, OrchestratorThread
from swarmrl.protocol import PoolClient
from swarmrl.protocol import models as api
from swarmrl.protocol.client import shared_tls
from swarmrl.rollouts import RolloutMeta, write_rollouts

JSON = {"Content-Type": "application/json"}
POSTGRES_ENV = "SWARMRL_TEST_POSTGRES_URL"
NO_POSTGRES = f"no PostgreSQL server: set {POSTGRES_ENV} (bash .ci/postgres.sh starts one)"
BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql", marks=pytest.mark.skipif(not os.environ.get(POSTGRES_ENV), reason=NO_POSTGRES)
    ),
]


def ledger_url_for(backend: str, tmp_path: Path) -> str:
    """A fresh, empty ledger database of the given kind."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    base = os.environ[POSTGRES_ENV]
    # One schema per test: tests never see each other's rows, and nothing needs dropping.
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    engine.dispose()
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


def rollout_columns(
    n: int, *, advantage: float = 0.5, tokens: int = 2, policy_step: int = 0
) -> dict[str, list]:
    return {
        "problem_id": [f"p{i // 2}" for i in range(n)],
        "input_tokens": [[1, 2, 3]] * n,
        "output_tokens": [list(range(4, 4 + tokens))] * n,
        "output_logprobs": [[-0.5] * tokens] * n,
        "rewards": [1.0] * n,
        "task_rewards": [1.0] * n,
        "length_penalties": [0.0] * n,
        "advantages": [advantage] * n,
        "target_lengths": [-1] * n,
        "policy_step": [policy_step] * n,
        "seed": list(range(n)),
        "proofs": [b"\x00" * 4] * n,
    }


def rollout_file(
    path: Path,
    worker: str,
    assignment: api.AssignmentInfo,
    policy_step: int | None = None,
    **meta,
) -> Path:
    """A schema-valid rollout file whose metadata matches `assignment` unless overridden;
    its samples claim the policy of the assignment's step unless `policy_step` is given."""
    n = assignment.prompts * assignment.group_size
    fields = {
        "run_id": "test",
        "worker_address": worker,
        "step": assignment.step,
        "submission": assignment.id,
        "num_samples": n,
        "num_nonzero": n,
    } | meta
    rows = fields["num_samples"] if fields["num_samples"] > 0 else 1
    # model_construct: a hostile file may carry metadata the strict model would refuse.
    claimed = assignment.step if policy_step is None else policy_step
    columns = rollout_columns(rows, policy_step=claimed)
    return write_rollouts(path, columns, RolloutMeta.model_construct(**fields))


@dataclass
class PoolUnderTest:
    """An orchestrator serving on loopback, with a registered trainer, validator and workers."""

    config: OrchestratorConfig
    tmp: Path
    server: OrchestratorThread | None = None
    trainer: PoolClient | None = None
    validator: PoolClient | None = None
    workers: list[PoolClient] = field(default_factory=list)
    keys: dict[str, Identity] = field(default_factory=dict)

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self) -> None:
        self.server = OrchestratorThread(self.config)
        self.server.start()
        for client in [self.trainer, self.validator, *self.workers]:
            if client is not None:
                client.close()
                client.url = self.url
                client.http = loopback_client(self.url)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, identity: Identity) -> PoolClient:
        return PoolClient(self.url, identity)

    def new_worker(self) -> PoolClient:
        client = self.client(Identity.generate())
        client.register("worker")
        self.workers.append(client)
        return client

    def ledger_state(self) -> dict:
        ledger = Ledger(self.config.ledger)
        try:
            with ledger.session() as s:
                return snapshot(s)
        finally:
            ledger.close()

    def ledger_problems(self) -> list[str]:
        ledger = Ledger(self.config.ledger)
        try:
            with ledger.session() as s:
                return check_ledger(s)
        finally:
            ledger.close()

    def secret(self) -> bytes:
        return bytes.fromhex(Path(self.config.secret_file).read_text().strip())

    def upload_for(
        self, worker: PoolClient, assignment: api.AssignmentInfo, **meta
    ) -> api.SubmissionInfo:
        path = rollout_file(
            self.tmp / f"a{assignment.id}-{uuid.uuid4().hex[:6]}.parquet",
            worker.address,
            assignment,
            **meta,
        )
        return worker.upload(assignment.id, path)


def make_pool(
    tmp_path: Path, backend: str = "sqlite", workers: int = 2, **overrides
) -> PoolUnderTest:
    trainer, validator = Identity.generate(), Identity.generate()
    allowlist = tmp_path / "allowlist"
    allowlist.write_text(f"{trainer.address} trainer\n{validator.address} validator\n")
    settings = {
        "ledger": ledger_url_for(backend, tmp_path),
        "store": str(tmp_path / "store"),
        "secret_file": str(tmp_path / "secret"),
        "allowlist": str(allowlist),
        "run_id": "test",
        "batch_samples": 8,
        "prompts_per_assignment": 2,
        "group_size": 2,
        "validation_fraction": 1.0,
        "max_open_per_worker": 8,
        "sweep_seconds": 0.1,
        # Members here call only when a test says so: nobody is declared dead for
        # silence within a test (the health tests set their own interval).
        "heartbeat_seconds": 120.0,
    } | overrides
    pool = PoolUnderTest(config=OrchestratorConfig(**settings), tmp=tmp_path)
    pool.start()
    pool.trainer = pool.client(trainer)
    pool.validator = pool.client(validator)
    pool.keys = {"trainer": trainer, "validator": validator}
    pool.trainer.register("trainer")
    pool.validator.register("validator")
    for _ in range(workers):
        pool.new_worker()
    return pool


def loopback_client(url: str) -> httpx.Client:
    """An HTTP client for a server on loopback, on the process's one TLS context (building
    one per client costs more than a request)."""
    return httpx.Client(base_url=url, timeout=60, verify=shared_tls())


def pool_id(url: str) -> str:
    """The pool id an orchestrator's requests sign (its public `GET /v1/signing`)."""
    with loopback_client(url) as http:
        return http.get("/v1/signing").json()["pool"]


def signed_raw(
    url: str,
    identity: Identity,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    **sign_args,
) -> httpx.Response:
    """Send one request whose signature headers can be tampered with (`headers` override)."""
    sign_args.setdefault("pool", pool_id(url))
    signed = sign_request(identity, method, path, body_digest(body), **sign_args)
    if body and method != "PUT":
        signed["Content-Type"] = "application/json"
    signed.update(headers or {})
    with loopback_client(url) as http:
        request = http.build_request(method, path, content=body, headers=signed)
        return http.send(request)


def orchestrator_process(
    tmp_path: Path, *args: str, cwd: Path | None = None, defaults: bool = True
) -> tuple[subprocess.Popen, str]:
    """`python -m swarmrl.orchestrator` on a free loopback port (its ledger, store and
    secret under `tmp_path` unless `defaults` is off) and its URL once it listens."""
    where = (
        [
            "--ledger",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--store",
            str(tmp_path / "store"),
            "--secret-file",
            str(tmp_path / "secret"),
        ]
        if defaults
        else []
    )
    log = tmp_path / "orchestrator.log"  # a file: a pipe nobody reads would fill and block it
    with open(log, "a") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "swarmrl.orchestrator", "--port", "0", *where, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=cwd,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("orchestrator listening on "):
        proc.kill()
        proc.wait()
        raise AssertionError(f"the orchestrator did not start: {line}{log.read_text()}")
    return proc, line.split()[-1]


# Hostile variations of an honest body, for the fuzz tests (in-thread and process).
def mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Apply (position, deleted length, inserted bytes) edits to data."""
    out = bytearray(data)
    for position, deleted, inserted in edits:
        at = position % (len(out) + 1)
        out[at : at + deleted] = inserted
    return bytes(out)


EDITS = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 4), st.binary(max_size=6)),
    min_size=1,
    max_size=4,
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=8,
)
