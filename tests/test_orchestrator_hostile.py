"""Hostile HTTP against a real `swarmrl orchestrator` process: bodies that once killed it
(deep nesting), lax types, an upload that decompresses to hundreds of MiB, requests
replayed from another pool and clients of the old protocol. The process must survive all
of it, answer 4xx, and change nothing it should not."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parquet_forge import understate_footer
from pool_fixtures import (
    EDITS,
    JSON,
    JSON_VALUES,
    mutate,
    pool_id,
    rollout_columns,
    rollout_file,
    signed_raw,
)
from swarmrl.config import RunConfig
from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.ledger import Ledger
from swarmrl.orchestrator import OrchestratorConfig
from swarmrl.orchestrator.auth import RateLimiter, RequestVerifier
from swarmrl.orchestrator.errors import Refusal
from swarmrl.orchestrator.pool import Pool
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.protocol import PoolClient, PoolRefused, recipe
from swarmrl.protocol import models as api
from swarmrl.rollouts import RolloutMeta, write_rollouts

# Every route that parses a JSON body (the upload is raw bytes).
JSON_ENDPOINTS = [
    "/v1/register",
    "/v1/heartbeat",
    "/v1/assignments",
    "/v1/submissions/trained",
    "/v1/steps/0/progress",
    "/v1/checkpoints",
    "/v1/validation/next",
    "/v1/verdicts",
    "/v1/pool/fund",
    "/v1/metrics",
]
DEEP = b"[" * 100_000 + b"]" * 100_000  # 195 KiB: once a SIGSEGV of the whole process


def start(tmp: Path, *args: str) -> tuple[subprocess.Popen, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    log = open(tmp / "orchestrator.log", "a")  # noqa: SIM115 (the process holds it)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarmrl.orchestrator",
            "--port",
            "0",
            "--ledger",
            f"sqlite:///{tmp / 'ledger.db'}",
            "--store",
            str(tmp / "store"),
            "--secret-file",
            str(tmp / "secret"),
            "--run-id",
            "test",
            "--prompts-per-assignment",
            "2",
            "--group-size",
            "2",
            "--batch-samples",
            "64",
            "--max-new-tokens",
            "64",
            "--rate-per-second",
            "1000",
            "--rate-burst",
            "1000",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("orchestrator listening on "), (
        line + (tmp / "orchestrator.log").read_text()
    )
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def alive(proc: subprocess.Popen, url: str) -> bool:
    return proc.poll() is None and httpx.get(url + "/v1/status", timeout=30).status_code == 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    trainer, owner = Identity.generate(), Identity.generate()
    (tmp / "allowlist").write_text(f"{trainer.address} trainer\n")
    proc, url = start(tmp, "--allowlist", str(tmp / "allowlist"), "--owner", owner.address)
    worker = PoolClient(url, Identity.generate())
    worker.register("worker")
    PoolClient(url, trainer).register("trainer")
    PoolClient(url, trainer).announce_checkpoint(0, "ab" * 32)
    yield proc, url, worker, owner, tmp
    stop(proc)


# -- hole 1: one unauthenticated body killed the process ----------------------------------


def test_the_hostile_tests_cover_every_json_endpoint(server):
    """JSON_ENDPOINTS is every POST route the live server documents (each reads a JSON
    body or none; a path parameter taken as 0), so a new endpoint is attacked here too."""
    _, url, *_ = server
    schema = httpx.get(url + "/openapi.json", timeout=30).json()
    posts = {
        re.sub(r"\{[^}]+\}", "0", path)
        for path, methods in schema["paths"].items()
        if "post" in methods
    }
    assert posts == set(JSON_ENDPOINTS)


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
def test_deep_nesting_unsigned_is_refused_and_the_process_lives(server, path):
    proc, url, *_ = server
    r = httpx.post(url + path, content=DEEP, headers=JSON, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    assert alive(proc, url)


def test_deep_nesting_signed_by_a_member_is_refused_too(server):
    proc, url, worker, *_ = server
    headers = sign_request(
        worker.identity, "POST", "/v1/heartbeat", body_digest(DEEP), pool=pool_id(url)
    )
    r = httpx.post(url + "/v1/heartbeat", content=DEEP, headers=headers | JSON, timeout=30)
    assert r.status_code == 400 and "not JSON" in r.json()["detail"], r.text
    assert alive(proc, url)


def _nested(depth: int, opener: bytes) -> bytes:
    closer = {b"[": b"]", b"{": b"}"}[opener]
    if opener == b"{":  # objects need keys: {"a":{"a":...}}
        return b'{"a":' * depth + b"0" + closer * depth
    return opener * depth + closer * depth


HOSTILE_BODIES = st.one_of(
    st.builds(_nested, st.integers(1, 150_000), st.sampled_from([b"[", b"{"])),
    st.integers(1, 150_000).map(lambda n: b"[" * n),  # unterminated
    st.integers(1, 150_000).map(lambda n: b'{"policy_step":' + b"[" * n + b"]" * n + b"}"),
    st.sampled_from(
        [
            b'{"policy_step": false}',
            b'{"policy_step": "3"}',
            b'{"policy_step": 3.0}',
            b'{"policy_step": 1e999}',
            b'{"policy_step": NaN}',
            b'{"policy_step": 99999999999999999999999999999}',
            b'{"role": ["worker"]}',
            b'{"address": {"$ne": 1}, "amount": 1}',
            b"null",
            b"[]",
            b"\xff\xfe{}",
        ]
    ),
    st.integers(1, 2 << 20).map(lambda n: b'"' + b"x" * n + b'"'),  # up to 2 MiB: 413
    st.binary(max_size=512),
)


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=HOSTILE_BODIES, path=st.sampled_from(JSON_ENDPOINTS))
def test_hostile_bodies_before_authentication_get_4xx(server, body, path):
    proc, url, *_ = server
    r = httpx.post(url + path, content=body, headers=JSON, timeout=60)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert proc.poll() is None


# -- hole 6: lax types --------------------------------------------------------------------


@pytest.mark.parametrize(
    "body", [b'{"policy_step": false}', b'{"policy_step": "3"}', b'{"policy_step": 3.0}']
)
def test_request_models_are_strict(server, body):
    _, url, worker, *_ = server
    headers = sign_request(
        worker.identity, "POST", "/v1/heartbeat", body_digest(body), pool=pool_id(url)
    )
    r = httpx.post(url + "/v1/heartbeat", content=body, headers=headers | JSON)
    assert r.status_code == 422, r.text
    assert "policy_step" in r.json()["detail"]
    honest = b'{"policy_step": 3}'
    headers = sign_request(
        worker.identity, "POST", "/v1/heartbeat", body_digest(honest), pool=pool_id(url)
    )
    assert (
        httpx.post(url + "/v1/heartbeat", content=honest, headers=headers | JSON).status_code == 200
    )


@pytest.mark.parametrize(
    "value",
    [b"-1", b"4611686018427387905", b"1" + b"0" * 400, b"true", b'"5"', b"5.0", b"[5]"],
    ids=["negative", "over-2^62", "400-digits", "bool", "string", "float", "list"],
)
def test_a_reported_bytes_served_out_of_bounds_is_refused(server, value):
    """The SHARDCAST servers' bytes served ride on heartbeats: bounded, strict, refused in
    one line by the real process, which stays up."""
    proc, url, worker, *_ = server
    body = b'{"policy_step": 0, "bytes_served": ' + value + b"}"
    headers = sign_request(
        worker.identity, "POST", "/v1/heartbeat", body_digest(body), pool=pool_id(url)
    )
    r = httpx.post(url + "/v1/heartbeat", content=body, headers=headers | JSON, timeout=30)
    assert r.status_code == 422, r.text
    assert "bytes_served" in r.json()["detail"]
    assert proc.poll() is None


# -- hole 3: signatures bound to the pool ------------------------------------------------


@pytest.mark.slow
def test_a_request_replayed_into_another_pool_is_refused(server, tmp_path):
    _, url_a, _, owner, _ = server
    proc_b, url_b = start(tmp_path / "b", "--owner", owner.address)
    try:
        assert pool_id(url_a) != pool_id(url_b)
        target = Identity.generate().address
        body = api.FundRequest(address=target, amount=5).model_dump_json().encode()
        headers = (
            sign_request(owner, "POST", "/v1/pool/fund", body_digest(body), pool=pool_id(url_a))
            | JSON
        )
        assert httpx.post(url_a + "/v1/pool/fund", content=body, headers=headers).status_code == 200
        replay = httpx.post(url_b + "/v1/pool/fund", content=body, headers=headers)
        assert replay.status_code == 401, replay.text
        assert "signed for pool" in replay.json()["detail"]
        status = PoolClient(url_b, None).status()
        assert all(m.balance == 0 for m in status.members)
        # The owner's own client, pointed at B, funds there: the pool id is asked for.
        assert PoolClient(url_b, owner).fund(target, 1).balance == 1
    finally:
        stop(proc_b)


# The recipe a worker of this test pool states (the `start` flags, the run's defaults for
# the rest): sampling and scoring included.
HONEST_RECIPE = recipe.of_run(RunConfig(), "worker").model_dump(exclude_none=True) | {
    "run_id": "test",
    "prompts_per_assignment": 2,
    "group_size": 2,
    "max_new_tokens": 64,
}


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fields=st.dictionaries(
        st.sampled_from(sorted(HONEST_RECIPE)) | st.text(max_size=12), JSON_VALUES, max_size=4
    ),
    edits=st.none() | EDITS,
)
def test_a_hostile_recipe_gets_an_answer_and_the_process_lives(server, fields, edits):
    """A registration states the whole recipe: its values replaced by any JSON, keys added,
    or its bytes edited, signed by a member, sent to the real process: 200 or a 4xx that
    says why, never a 5xx, and the process lives on."""
    proc, url, worker, *_ = server
    honest = json.dumps({"role": "worker", "recipe": HONEST_RECIPE}).encode()
    assert signed_raw(url, worker.identity, "POST", "/v1/register", honest).status_code == 200
    body = json.dumps({"role": "worker", "recipe": HONEST_RECIPE | fields}).encode()
    if edits is not None:
        body = mutate(body, edits)
    r = signed_raw(url, worker.identity, "POST", "/v1/register", body)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert api.Problem.model_validate_json(r.content).detail, r.text
    assert proc.poll() is None


def test_a_stranger_registering_as_a_validator_is_refused_and_the_process_lives(server):
    # Registering again as a validator gives back that validator's leases: a key the
    # allowlist does not name is refused before anything of the kind, and a replay of
    # the refused request is refused again.
    proc, url, *_ = server
    stranger = Identity.generate()
    body = api.RegisterRequest(role="validator").model_dump_json().encode()
    headers = sign_request(stranger, "POST", "/v1/register", body_digest(body), pool=pool_id(url))
    first = httpx.post(url + "/v1/register", content=body, headers=headers | JSON, timeout=30)
    assert first.status_code == 403 and "allowlist" in first.json()["detail"], first.text
    again = httpx.post(url + "/v1/register", content=body, headers=headers | JSON, timeout=30)
    assert 400 <= again.status_code < 500, again.text
    assert all(m.address != stranger.address for m in PoolClient(url, None).status().members)
    assert alive(proc, url)


# -- the validators' long poll: a query parameter that holds a request -------------------


@pytest.fixture(scope="module")
def validator_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-validator")
    validator = Identity.generate()
    (tmp / "allowlist").write_text(f"{validator.address} validator\n")
    proc, url = start(tmp, "--allowlist", str(tmp / "allowlist"))
    PoolClient(url, validator).register("validator")
    yield proc, url, validator
    stop(proc)


def _holds(wait: str) -> bool:
    """A value the orchestrator would accept and hold for (skipped: each costs its wait)."""
    try:
        return 0.2 < float(wait) <= 10
    except ValueError:
        return False


@given(
    wait=st.one_of(
        st.text(max_size=40),
        st.floats().map(repr),
        st.integers().map(str),
        st.sampled_from(["-0", "1e400", "nan", "-inf", "10.000001", "0x5", "1_0", " 1", ""]),
    )
)
@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_hostile_wait_gets_an_answer_at_once_and_the_process_lives(validator_server, wait):
    """Any `wait` text a validator signs: 200 (a number in bounds) or 422 with a reason,
    never held past the bound, never 5xx; the process stays up."""
    from urllib.parse import quote

    from hypothesis import assume

    assume(not _holds(wait))
    proc, url, validator = validator_server
    path = "/v1/validation/next?wait=" + quote(wait, safe="")
    headers = sign_request(validator, "POST", path, body_digest(b""), pool=pool_id(url))
    started = time.monotonic()
    r = httpx.post(url + path, headers=headers, timeout=30)
    assert r.status_code == 200 or (400 <= r.status_code < 500 and r.json()["detail"]), r.text
    assert time.monotonic() - started < 5
    assert proc.poll() is None


def test_strangers_and_replays_are_not_held(validator_server):
    """A long poll is a member's: an unsigned request, a stranger's and a replay asking
    for the longest wait are refused at once; a validator's is held, once."""
    proc, url, validator = validator_server
    path = "/v1/validation/next?wait=10"
    stranger = Identity.generate()
    for headers in (
        {},
        sign_request(stranger, "POST", path, body_digest(b""), pool=pool_id(url)),
    ):
        started = time.monotonic()
        r = httpx.post(url + path, headers=headers, timeout=30)
        assert 400 <= r.status_code < 500, r.text
        assert time.monotonic() - started < 5
    short = "/v1/validation/next?wait=0.5"
    headers = sign_request(validator, "POST", short, body_digest(b""), pool=pool_id(url))
    started = time.monotonic()
    first = httpx.post(url + short, headers=headers, timeout=30)
    assert first.status_code == 200 and first.json()["submission"] is None
    assert time.monotonic() - started >= 0.45  # held: nothing came
    started = time.monotonic()
    again = httpx.post(url + short, headers=headers, timeout=30)
    assert 400 <= again.status_code < 500, again.text
    assert time.monotonic() - started < 0.45  # a replay is refused before any wait
    assert alive(proc, url)


def _signed_the_old_way(identity: Identity, method: str, path: str, body: bytes) -> dict:
    """Headers a swarmrl/1 client sends: its text names no pool, and no X-Pool header."""
    timestamp, nonce = int(time.time()), os.urandom(16).hex()
    text = f"swarmrl/1\n{method}\n{path}\n{body_digest(body)}\n{timestamp}\n{nonce}"
    signed = Account.sign_message(encode_defunct(text=text), identity.key.secret)
    return {
        "X-Address": identity.address,
        "X-Timestamp": str(timestamp),
        "X-Nonce": nonce,
        "X-Signature": "0x" + bytes(signed.signature).hex(),
    }


def test_an_old_client_is_told_to_upgrade(server):
    _, url, worker, *_ = server
    body = b'{"policy_step": 0}'
    for method, path, content in [
        ("POST", "/v1/heartbeat", body),
        ("GET", "/v1/steps/0/submissions", b""),
    ]:
        headers = _signed_the_old_way(worker.identity, method, path, content) | JSON
        r = httpx.request(method, url + path, content=content or None, headers=headers)
        assert r.status_code == 426, r.text
        assert "swarmrl/1" in r.json()["detail"] and "upgrade" in r.json()["detail"]


@pytest.mark.parametrize(
    ("signing", "said"),
    [(None, "older than this client"), (b'{"protocol": "swarmrl/3", "pool": "ab"}', "swarmrl/3")],
    ids=["no-signing-endpoint", "other-protocol"],
)
def test_a_new_client_at_an_old_orchestrator_is_told_why(signing, said):
    """An orchestrator that predates pool-bound signatures has no /v1/signing (404); one of
    another version answers another protocol. A real HTTP server on loopback plays it."""

    class Old(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/v1/signing" and signing is not None
            self.send_response(200 if found else 404)
            body = signing if found else b'{"detail": "Not Found"}'
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Old)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with PoolClient(url, Identity.generate()) as c, pytest.raises(PoolRefused) as refused:
            c.register("worker")
        assert refused.value.status == 426 and said in refused.value.detail
    finally:
        server.shutdown()
        server.server_close()


# -- hole 2: the upload decompression bomb ------------------------------------------------


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def _bomb(path: Path, worker: str, a: api.AssignmentInfo, rows: int, tokens: int) -> Path:
    """A schema-valid file of `rows` samples of `tokens` zero tokens each: a few kB that
    decode to rows x tokens x 8 bytes."""
    columns: dict = rollout_columns(rows)
    offsets = pa.array(np.arange(0, (rows + 1) * tokens, tokens, dtype=np.int32))
    columns["output_tokens"] = pa.ListArray.from_arrays(
        offsets, pa.array(np.zeros(rows * tokens, dtype=np.int32))
    )
    columns["output_logprobs"] = pa.ListArray.from_arrays(
        offsets, pa.array(np.zeros(rows * tokens, dtype=np.float32))
    )
    meta = RolloutMeta.model_construct(
        run_id="test",
        worker_address=worker,
        step=a.step,
        submission=a.id,
        num_samples=rows,
        num_nonzero=rows,
    )
    return write_rollouts(path, columns, meta)


@pytest.mark.parametrize(
    ("rows", "tokens", "forged"),
    [(384, 16_384, False), (4, 1 << 20, False), (4, 1 << 22, True)],
    ids=["rows", "tokens", "forged-footer"],
)
def test_a_bomb_upload_is_refused_before_it_is_decoded(server, rows, tokens, forged):
    """forged: the footer claims 64 values and 2 kB per column chunk while the pages hold
    16 M zero tokens (decoded to 100 MiB before the page headers were checked)."""
    proc, url, worker, _, tmp = server
    a = worker.assignment(0).assignment
    assert a is not None
    bomb = _bomb(tmp / f"bomb-{rows}.parquet", worker.address, a, rows, tokens)
    if forged:
        bomb = understate_footer(bomb, tmp / "forged.parquet", 64, 2048)
    assert bomb.stat().st_size < 64 * 1024
    before = _peak_rss_kib(proc.pid)
    with pytest.raises(PoolRefused) as refused:
        worker.upload(a.id, bomb)
    grown_mib = (_peak_rss_kib(proc.pid) - before) / 1024
    assert refused.value.status == 422
    assert not forged or "its pages hold" in refused.value.detail
    assert grown_mib < 16, f"the orchestrator's peak memory grew {grown_mib:.0f} MiB"
    # It cost the sender its assignment: closed, not open for another try.
    honest = rollout_file(tmp / f"honest-{rows}.parquet", worker.address, a)
    with pytest.raises(PoolRefused) as again:
        worker.upload(a.id, honest)
    assert again.value.status == 409 and "lapsed" in again.value.detail
    assert alive(proc, url)


UPLOAD_MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "truncate"]),
        st.integers(0, 1 << 20),
        st.integers(1, 255),
    ),
    min_size=1,
    max_size=3,
)


@pytest.mark.slow
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutations=UPLOAD_MUTATIONS)
def test_mutated_uploads_get_an_answer_and_the_process_lives(server, mutations):
    """A member's honest file with bytes flipped, inserted, deleted or cut, uploaded for its
    own open assignment (signature and body hash right, so it reaches the footer, the page
    headers and the columns): 201 or a 4xx, never a 5xx, and the server lives on."""
    proc, url, _, _, tmp = server
    worker = PoolClient(url, Identity.generate())  # a fresh member: a refusal costs its record
    worker.register("worker")
    a = worker.assignment(0).assignment
    assert a is not None
    data = bytearray(rollout_file(tmp / f"honest-{a.id}.parquet", worker.address, a).read_bytes())
    for kind, where, byte in mutations:
        at = where % max(len(data), 1)
        if kind == "flip":
            data[at] ^= byte
        elif kind == "insert":
            data[at:at] = bytes([byte])
        elif kind == "delete":
            del data[at]
        else:
            del data[max(at, 1) :]
    path = tmp / f"mutated-{a.id}.parquet"
    path.write_bytes(bytes(data))
    try:
        worker.upload(a.id, path)
    except PoolRefused as exc:
        assert 400 <= exc.status < 500, exc
    assert alive(proc, url)


# -- hole 6: a replay held back behind the pool lock --------------------------------------


def test_a_replay_that_waited_past_the_window_is_refused(tmp_path):
    """A request checked on the event loop inside the window, then held behind the pool
    lock while the sweep forgot its first use's nonce, must not run a second time."""
    now = [time.time()]
    config = OrchestratorConfig(
        ledger=f"sqlite:///{tmp_path / 'ledger.db'}",
        store=str(tmp_path / "store"),
        secret_file=str(tmp_path / "secret"),
        timestamp_window=5,
    )
    ledger = Ledger(config.ledger)
    try:
        pool = Pool(config, ledger, RolloutStore(config.store), b"s" * 32, {}, clock=lambda: now[0])
        verifier = RequestVerifier(config.timestamp_window, "ab" * 16)
        worker = Identity.generate()

        def caller(path: str, body: bytes):
            headers = sign_request(worker, "POST", path, body_digest(body), pool="ab" * 16)
            return verifier.verify("POST", path, headers, body_digest(body))

        pool.register(caller("/v1/register", b"r"), api.RegisterRequest(role="worker"))
        beat = caller("/v1/heartbeat", b"{}")
        pool.heartbeat(beat, api.HeartbeatRequest())
        now[0] += config.timestamp_window + 2  # the replay waited; the sweep ran meanwhile
        pool.sweep()
        with pytest.raises(Refusal) as refused:
            pool.heartbeat(beat, api.HeartbeatRequest())
        assert refused.value.status == 401 and "window" in refused.value.detail
    finally:
        ledger.close()


# -- what strangers can make the pool keep ---------------------------------------------


def test_the_rate_limiter_forgets_refilled_buckets():
    now = [0.0]
    limiter = RateLimiter(rate=10.0, burst=5, clock=lambda: now[0])
    for i in range(3 * RateLimiter.PRUNE_FROM):
        assert limiter.allow(f"0x{i:040x}")
        now[0] += 0.001  # 3 s of strangers, one request each
    # a bucket refills in burst / rate = 0.5 s: only the last half second's are kept
    assert len(limiter) <= RateLimiter.PRUNE_FROM + 500
    busy = "0x" + "ab" * 20
    assert all(limiter.allow(busy) for _ in range(5)) and not limiter.allow(busy)


def test_new_members_join_at_the_pool_rate_and_members_rejoin_freely(tmp_path):
    now = [time.time()]
    config = OrchestratorConfig(
        ledger=f"sqlite:///{tmp_path / 'ledger.db'}",
        store=str(tmp_path / "store"),
        secret_file=str(tmp_path / "secret"),
        join_rate_per_second=1.0,
        join_burst=2,
    )
    ledger = Ledger(config.ledger)
    try:
        pool = Pool(
            config,
            ledger,
            RolloutStore(config.store),
            b"s" * 32,
            {},
            clock=lambda: now[0],
            joins=RateLimiter(1.0, 2, clock=lambda: now[0]),
        )
        verifier = RequestVerifier(config.timestamp_window, "ab" * 16)

        def join(who: Identity) -> api.Member:
            body = b'{"role": "worker"}'
            headers = sign_request(who, "POST", "/v1/register", body_digest(body), pool="ab" * 16)
            caller = verifier.verify("POST", "/v1/register", headers, body_digest(body))
            return pool.register(caller, api.RegisterRequest(role="worker"))

        first, second, third = (Identity.generate() for _ in range(3))
        join(first)
        join(second)
        with pytest.raises(Refusal) as refused:
            join(third)
        assert refused.value.status == 429 and "new members a second" in refused.value.detail
        join(first)  # a member registering again is not a new row: never limited
        now[0] += 1.0
        assert join(third).address == third.address
    finally:
        ledger.close()


# -- signatures recovered with coincurve: forged bytes through the real process ----------

_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # secp256k1's n


@pytest.mark.parametrize(
    "forge",
    [
        lambda sig: sig[:64] + bytes([35]),  # an EIP-155-style v
        lambda sig: sig[:64] + bytes([29]),
        lambda sig: bytes(32) + sig[32:],  # r = 0
        lambda sig: sig[:32] + bytes(32) + sig[64:],  # s = 0
        lambda sig: _ORDER.to_bytes(32, "big") + sig[32:],  # r = n
        lambda sig: b"\xff" * 65,
        lambda sig: sig[:10] + bytes([sig[10] ^ 1]) + sig[11:],  # another signer
        lambda sig: sig[:64],  # too short for the header's shape
    ],
    ids=["v35", "v29", "r0", "s0", "r-order", "all-ff", "flipped-bit", "short"],
)
def test_forged_signature_bytes_are_refused_by_the_live_process(server, forge):
    """Each forged signature on an honest heartbeat is a 401 (or the header's 400/422), and
    the process answers on; the same request with the recovery id written bare (v 0/1,
    as some Ethereum tools write it) passes."""
    proc, url, worker, *_ = server
    body = b'{"policy_step": 0}'
    pool = pool_id(url)

    def signed(transform):
        headers = sign_request(
            worker.identity, "POST", "/v1/heartbeat", body_digest(body), pool=pool
        )
        sig = bytes.fromhex(headers["X-Signature"][2:])
        return headers | {"X-Signature": "0x" + transform(sig).hex()} | JSON

    r = httpx.post(url + "/v1/heartbeat", content=body, headers=signed(forge), timeout=30)
    assert r.status_code in (400, 401, 422), r.text
    bare = httpx.post(
        url + "/v1/heartbeat",
        content=body,
        headers=signed(lambda sig: sig[:64] + bytes([sig[64] - 27])),
        timeout=30,
    )
    assert bare.status_code == 200, bare.text
    assert alive(proc, url)
