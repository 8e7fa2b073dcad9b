"""The orchestrator over real HTTP on loopback, with a real ledger (SQLite, and PostgreSQL
when available): every refusal leaves the ledger unchanged."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pyarrow.parquet as pq
import pytest
from rich.console import Console
from sqlalchemy import func, select

from pool_fixtures import BACKENDS, make_pool, pool_id, rollout_file, signed_raw
from swarmrl.commands.status import render
from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.ledger import Ledger, Nonce
from swarmrl.orchestrator import OrchestratorThread
from swarmrl.orchestrator.issuance import assignment_seed
from swarmrl.protocol import PoolClient, PoolRefused, PoolUnreachable

BLAKE = "ab" * 32
JSON = {"Content-Type": "application/json"}


@pytest.fixture(params=BACKENDS)
def pool(request, tmp_path):
    p = make_pool(tmp_path, request.param)
    p.trainer.announce_checkpoint(0, BLAKE)
    yield p
    p.stop()


def refused(call, status: int) -> str:
    with pytest.raises(PoolRefused) as info:
        call()
    assert info.value.status == status, info.value
    return info.value.detail


def unchanged(pool, action, status: int) -> httpx.Response | str:
    """Run a refused action; the ledger (all but spent nonces) must not change."""
    before = pool.ledger_state()
    result = action()
    if isinstance(result, httpx.Response):
        assert result.status_code == status, result.text
    assert pool.ledger_state() == before
    return result


# -- signatures, timestamps, nonces ---------------------------------------------------------


def test_forged_signature_is_refused(pool):
    worker = pool.workers[0]
    forger = Identity.generate()
    body = b'{"policy_step": 0}'
    # Headers claim the worker's address; the signature is another key's.
    forged = sign_request(
        forger, "POST", "/v1/assignments", body_digest(body), pool=pool_id(pool.url)
    )
    r = unchanged(
        pool,
        lambda: signed_raw(
            pool.url,
            worker.identity,
            "POST",
            "/v1/assignments",
            body,
            headers={"X-Signature": forged["X-Signature"]},
        ),
        401,
    )
    assert "recovers to another key" in r.json()["detail"]


def test_garbage_signature_is_refused(pool):
    r = unchanged(
        pool,
        lambda: signed_raw(
            pool.url,
            pool.workers[0].identity,
            "POST",
            "/v1/heartbeat",
            b"{}",
            headers={"X-Signature": "0x" + "00" * 65},
        ),
        401,
    )
    assert "signature" in r.json()["detail"]


def test_request_signed_for_another_address_is_refused(pool):
    a, b = pool.workers
    # a signs honestly, but claims to be b (a registered member).
    r = unchanged(
        pool,
        lambda: signed_raw(
            pool.url,
            a.identity,
            "POST",
            "/v1/assignments",
            b'{"policy_step": 0}',
            headers={"X-Address": b.address},
        ),
        401,
    )
    assert b.address in r.json()["detail"]


def test_signature_binds_method_path_and_body(pool):
    worker = pool.workers[0]
    good = (
        sign_request(
            worker.identity, "POST", "/v1/heartbeat", body_digest(b"{}"), pool=pool_id(pool.url)
        )
        | JSON
    )
    with httpx.Client(base_url=pool.url) as http:
        # The same headers on another path, and with another body.
        other_path = http.post("/v1/assignments", content=b'{"policy_step": 0}', headers=good)
        other_body = http.post("/v1/heartbeat", content=b'{"policy_step": 3}', headers=good)
    assert other_path.status_code == 401
    assert other_body.status_code == 401


def test_replayed_nonce_is_refused_within_the_window(pool):
    worker = pool.workers[0]
    body = b'{"policy_step": 0}'
    headers = (
        sign_request(
            worker.identity, "POST", "/v1/assignments", body_digest(body), pool=pool_id(pool.url)
        )
        | JSON
    )
    with httpx.Client(base_url=pool.url) as http:
        first = http.post("/v1/assignments", content=body, headers=headers)
        assert first.status_code == 200 and first.json()["assignment"] is not None
        before = pool.ledger_state()
        replay = http.post("/v1/assignments", content=body, headers=headers)
    assert replay.status_code == 401
    assert "nonce already used" in replay.json()["detail"]
    assert pool.ledger_state() == before  # no second assignment


def test_replayed_nonce_is_refused_after_a_restart(pool):
    worker = pool.workers[0]
    body = b'{"policy_step": 0}'
    headers = (
        sign_request(
            worker.identity, "POST", "/v1/assignments", body_digest(body), pool=pool_id(pool.url)
        )
        | JSON
    )
    with httpx.Client(base_url=pool.url) as http:
        assert http.post("/v1/assignments", content=body, headers=headers).status_code == 200
    pool.restart()
    before = pool.ledger_state()
    with httpx.Client(base_url=pool.url) as http:
        replay = http.post("/v1/assignments", content=body, headers=headers)
    assert replay.status_code == 401, replay.text
    assert pool.ledger_state() == before


def test_a_strangers_refused_request_is_not_served_once_it_registers(pool):
    # Refused now (the sender is not registered yet, so nothing is written), it must not
    # be served when replayed later, once the pool would accept it: it was signed before
    # the key's registration.
    newcomer = Identity.generate()
    body = b'{"policy_step": 0}'
    signed_at = int(time.time()) - 1
    headers = (
        sign_request(
            newcomer,
            "POST",
            "/v1/heartbeat",
            body_digest(body),
            pool=pool_id(pool.url),
            timestamp=signed_at,
        )
        | JSON
    )
    with httpx.Client(base_url=pool.url) as http:
        before = pool.ledger_state()
        first = http.post("/v1/heartbeat", content=body, headers=headers)
        assert first.status_code == 403, first.text
        assert pool.ledger_state() == before
        pool.client(newcomer).register("worker")
        replay = http.post("/v1/heartbeat", content=body, headers=headers)
    assert replay.status_code == 401, replay.text
    assert "before" in replay.json()["detail"] and "registered" in replay.json()["detail"]


def test_strangers_refused_requests_write_no_nonce_rows(pool):
    ledger = Ledger(pool.config.ledger)
    try:

        def nonce_rows() -> int:
            with ledger.session() as s:
                return int(s.scalar(select(func.count()).select_from(Nonce)) or 0)

        before = nonce_rows()
        with httpx.Client(base_url=pool.url) as http:
            for _ in range(50):
                stranger = Identity.generate()
                body = b'{"policy_step": 0}'
                headers = sign_request(
                    stranger, "POST", "/v1/assignments", body_digest(body), pool=pool_id(pool.url)
                )
                r = http.post("/v1/assignments", content=body, headers=headers | JSON)
                assert r.status_code == 403, r.text
        assert nonce_rows() == before
    finally:
        ledger.close()


def test_a_rate_limited_request_spends_its_nonce_too(tmp_path):
    p = make_pool(tmp_path, rate_per_second=0.01, rate_burst=1)
    try:
        worker = Identity.generate()
        # registering takes the one token; the heartbeat is over the rate
        p.client(worker).register("worker")
        body = b'{"policy_step": 0}'
        headers = (
            sign_request(worker, "POST", "/v1/heartbeat", body_digest(body), pool=pool_id(p.url))
            | JSON
        )
        with httpx.Client(base_url=p.url) as http:
            assert http.post("/v1/heartbeat", content=body, headers=headers).status_code == 429
            replay = http.post("/v1/heartbeat", content=body, headers=headers)
        assert replay.status_code == 401 and "nonce already used" in replay.json()["detail"]
    finally:
        p.stop()


@pytest.mark.parametrize("skew", [-120, 120])
def test_stale_or_future_timestamp_is_refused(pool, skew):
    worker = pool.workers[0]
    r = unchanged(
        pool,
        lambda: signed_raw(
            pool.url,
            worker.identity,
            "POST",
            "/v1/assignments",
            b'{"policy_step": 0}',
            timestamp=int(time.time()) + skew,
        ),
        401,
    )
    assert "window" in r.json()["detail"]


@pytest.mark.parametrize(
    "header, value",
    [
        ("X-Address", "0x1234"),
        ("X-Timestamp", "soon"),
        ("X-Nonce", "abc"),
        ("X-Signature", "0xzz"),
    ],
)
def test_malformed_signature_headers_are_refused(pool, header, value):
    r = unchanged(
        pool,
        lambda: signed_raw(
            pool.url,
            pool.workers[0].identity,
            "POST",
            "/v1/heartbeat",
            b"{}",
            headers={header: value},
        ),
        401,
    )
    assert header in r.json()["detail"]


def test_unsigned_request_is_refused(pool):
    with httpx.Client(base_url=pool.url) as http:
        r = unchanged(pool, lambda: http.post("/v1/heartbeat", content=b"{}"), 401)
    assert "missing header" in r.json()["detail"]


def test_unregistered_sender_is_refused(pool):
    stranger = PoolClient(pool.url, Identity.generate())
    for call in (
        lambda: stranger.heartbeat(0),
        lambda: stranger.assignment(0),
        lambda: stranger.submissions_for_step(0),
        stranger.next_for_validation,
    ):
        before = pool.ledger_state()
        assert "not registered" in refused(call, 403)
        assert pool.ledger_state() == before


def test_trusted_roles_need_the_allowlist(pool):
    outsider = PoolClient(pool.url, Identity.generate())
    for role in ("trainer", "validator", "relay"):
        before = pool.ledger_state()
        assert "allowlist" in refused(lambda r=role: outsider.register(r), 403)
        assert pool.ledger_state() == before
    # A worker cannot switch roles either.
    assert "allowlist" in refused(lambda: pool.workers[0].register("validator"), 403)


def test_rate_limit_per_address(tmp_path):
    p = make_pool(tmp_path, rate_per_second=0.5, rate_burst=5)
    try:
        worker = p.workers[0]
        statuses = []
        for _ in range(8):
            try:
                worker.heartbeat(0)
                statuses.append(200)
            except PoolRefused as exc:
                statuses.append(exc.status)
        # register used one token: four more heartbeats pass, then 429.
        assert statuses[:4] == [200] * 4
        assert 429 in statuses[4:]
        # Another address has its own bucket.
        p.workers[1].heartbeat(0)
    finally:
        p.stop()


# -- uploads: size, hash, names --------------------------------------------------------------


def _assignment(pool, worker=None):
    worker = worker or pool.workers[0]
    a = worker.assignment(0).assignment
    assert a is not None
    return worker, a


def test_upload_is_recorded_and_downloadable(pool):
    worker, a = _assignment(pool)
    path = rollout_file(pool.tmp / "ok.parquet", worker.address, a)
    info = worker.upload(a.id, path)
    assert info.state == "pending" and info.step == 0 and info.assignment_id == a.id
    # Chosen for validation (the fraction is 1 here): listed for the trainer once accepted.
    assert pool.trainer.submissions_for_step(0).submissions == []
    pool.validator.post_verdict(info.file_hash, True)
    listed = pool.trainer.submissions_for_step(0).submissions
    assert [s.file_hash for s in listed] == [info.file_hash]
    got = pool.trainer.download(info.file_hash, pool.tmp / "got.parquet")
    assert got.read_bytes() == path.read_bytes()
    # The assignment is closed: the same file again is refused.
    assert "returned" in refused(lambda: worker.upload(a.id, path), 409)
    assert pool.ledger_problems() == []


def test_oversized_upload_is_refused(tmp_path):
    p = make_pool(tmp_path, max_upload_bytes=6000)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker, a = _assignment(p)
        big = b"x" * 7000
        path = f"/v1/assignments/{a.id}/rollout?sha256={body_digest(big)}"
        r = unchanged(p, lambda: signed_raw(p.url, worker.identity, "PUT", path, big), 413)
        assert "limit" in r.json()["detail"]

        # Without a declared length (chunked), the stream is cut at the limit.
        def chunked():
            headers = sign_request(
                worker.identity, "PUT", path, body_digest(big), pool=pool_id(p.url)
            )
            with httpx.Client(base_url=p.url) as http:
                return http.put(path, content=iter([big[:3000], big[3000:]]), headers=headers)

        r = unchanged(p, chunked, 413)
        assert "limit" in r.json()["detail"]
        # The assignment is still open: an honest file is accepted afterwards.
        p.upload_for(worker, a)
    finally:
        p.stop()


def test_hash_mismatch_is_refused(pool):
    worker, a = _assignment(pool)
    data = rollout_file(pool.tmp / "f.parquet", worker.address, a).read_bytes()
    claimed = body_digest(data + b"!")
    path = f"/v1/assignments/{a.id}/rollout?sha256={claimed}"
    # Signed over the claimed hash (as a streaming sender does); the bytes differ.
    headers = sign_request(worker.identity, "PUT", path, claimed, pool=pool_id(pool.url))
    with httpx.Client(base_url=pool.url) as http:
        r = unchanged(pool, lambda: http.put(path, content=data, headers=headers), 400)
    assert "hash to" in r.json()["detail"]


@pytest.mark.parametrize(
    "path, status",
    [
        ("/v1/submissions/..%2F..%2Fsecret/file", 404),
        ("/v1/submissions/..secret/file", 422),
        ("/v1/submissions/%2E%2E%2Fledger.db/file", 404),
        (f"/v1/submissions/{'0' * 63}g/file", 422),
    ],
)
def test_path_traversal_names_are_refused(pool, path, status):
    r = unchanged(pool, lambda: signed_raw(pool.url, pool.trainer.identity, "GET", path), status)
    assert r.content != (pool.tmp / "secret").read_bytes()


def test_path_traversal_in_upload_path_is_refused(pool):
    worker, a = _assignment(pool)
    data = rollout_file(pool.tmp / "f.parquet", worker.address, a).read_bytes()
    for path, status in (
        (f"/v1/assignments/..%2F{a.id}/rollout?sha256={body_digest(data)}", 404),
        (f"/v1/assignments/..{a.id}/rollout?sha256={body_digest(data)}", 422),
        (f"/v1/assignments/{a.id}/rollout?sha256=..%2F..%2Fsecret", 422),
    ):
        unchanged(
            pool, lambda p=path: signed_raw(pool.url, worker.identity, "PUT", p, data), status
        )
    assert sorted(x.name for x in (pool.tmp / "store").rglob("*") if x.is_file()) == []


def test_stored_names_are_chosen_by_the_orchestrator(pool):
    from swarmrl.orchestrator.store import RolloutStore

    store = RolloutStore(str(pool.tmp / "store"))
    for bad in ("../secret", "step_000000/../../x.parquet", "/etc/passwd", "step_000000/A.parquet"):
        with pytest.raises(ValueError):
            store.open(bad)
    with pytest.raises(ValueError):
        store.name_for(0, "../" + "0" * 61)


# -- grinding and forging --------------------------------------------------------------------


def test_upload_for_an_assignment_never_issued_is_refused(pool):
    worker, a = _assignment(pool)
    fake = a.model_copy(update={"id": a.id + 100})
    path = rollout_file(pool.tmp / "f.parquet", worker.address, fake)
    before = pool.ledger_state()
    assert "never issued" in refused(lambda: worker.upload(fake.id, path), 404)
    assert pool.ledger_state() == before


def test_upload_for_another_workers_assignment_is_refused(pool):
    owner, thief = pool.workers
    _, a = _assignment(pool, owner)
    path = rollout_file(pool.tmp / "f.parquet", thief.address, a)
    before = pool.ledger_state()
    assert "another worker" in refused(lambda: thief.upload(a.id, path), 403)
    assert pool.ledger_state() == before


def assert_lapsed_by_refusal(pool, worker, a) -> None:
    """A file refused for what it holds records nothing and costs its sender the
    assignment: lapsed (a lapse counted), so the same assignment takes no second try."""
    status = pool.trainer.status()
    assert sum(status.submissions.values()) == 0
    assert {m.address: m.lapses for m in status.members}[worker.address] == 1
    honest = rollout_file(pool.tmp / "honest.parquet", worker.address, a)
    assert "lapsed" in refused(lambda: worker.upload(a.id, honest), 409)


@pytest.mark.parametrize(
    "field, value",
    [
        ("step", 1),
        ("submission", 999),
        ("worker_address", "0x" + "11" * 20),
        ("num_samples", 3),
        ("run_id", "another-run"),
        ("num_nonzero", 9),
    ],
)
def test_file_whose_metadata_disagrees_with_its_assignment_is_refused(pool, field, value):
    worker, a = _assignment(pool)
    path = rollout_file(pool.tmp / "f.parquet", worker.address, a)
    # Written as an attacker would: the metadata as raw JSON, past the writer's own checks.
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"swarmrl"]) | {field: value}
    pq.write_table(table.replace_schema_metadata({b"swarmrl": json.dumps(meta).encode()}), path)
    detail = refused(lambda: worker.upload(a.id, path), 422)
    assert field in detail
    assert_lapsed_by_refusal(pool, worker, a)


def test_garbage_file_is_refused(pool):
    worker, a = _assignment(pool)
    path = pool.tmp / "garbage.parquet"
    path.write_bytes(b"PAR1 not really")
    assert "unreadable" in refused(lambda: worker.upload(a.id, path), 422)
    assert_lapsed_by_refusal(pool, worker, a)


def test_worker_cannot_choose_its_seed(pool):
    worker = pool.workers[0]
    body = json.dumps({"policy_step": 0, "seed": 7}).encode()
    r = unchanged(
        pool, lambda: signed_raw(pool.url, worker.identity, "POST", "/v1/assignments", body), 422
    )
    assert "seed" in r.text
    _, a = _assignment(pool, worker)
    assert a.seed == assignment_seed(pool.secret(), a.id)


# -- roles -----------------------------------------------------------------------------------


def test_verdict_from_a_non_validator_is_refused(pool):
    worker, a = _assignment(pool)
    info = pool.upload_for(worker, a)
    for impostor in (worker, pool.trainer):
        before = pool.ledger_state()
        assert "needs a validator" in refused(
            lambda c=impostor: c.post_verdict(info.file_hash, True), 403
        )
        assert pool.ledger_state() == before


def test_workers_cannot_use_trainer_endpoints(pool):
    worker, a = _assignment(pool)
    info = pool.upload_for(worker, a)
    for call in (
        lambda: worker.submissions_for_step(0),
        lambda: worker.download(info.file_hash, pool.tmp / "x"),
        lambda: worker.mark_trained(0, [info.file_hash]),
        lambda: worker.announce_checkpoint(1, BLAKE),
        worker.next_for_validation,
    ):
        before = pool.ledger_state()
        refused(call, 403)
        assert pool.ledger_state() == before


# -- issuance --------------------------------------------------------------------------------


def test_issuance_stops_when_the_step_is_full(tmp_path):
    # 8 usable samples needed; 4 samples per assignment; before any file the yield is
    # assumed 0.5, so ceil(8 × 1.1 / 2) = 5 assignments cover the step.
    p = make_pool(tmp_path, async_level=0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker = p.workers[0]
        issued = []
        while (r := worker.assignment(0)).assignment is not None:
            issued.append(r.assignment)
            assert len(issued) <= 5
        assert len(issued) == 5 and {a.step for a in issued} == {0}
        assert "need no more work" in r.reason
        # Two full files (yield 1.0) fill the step: nothing more is issued, even
        # after the other open assignments lapse.
        for a in issued[:2]:
            p.upload_for(worker, a)
        status = PoolClient(p.url, None).status()
        assert status.steps[0].full and status.steps[0].usable_samples == 8
        assert p.workers[1].assignment(0).assignment is None
        # The trainer moves on: step 1 opens.
        p.trainer.announce_checkpoint(1, BLAKE)
        nxt = p.workers[1].assignment(1).assignment
        assert nxt is not None and nxt.step == 1
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_issuance_follows_the_observed_yield(tmp_path):
    p = make_pool(tmp_path, async_level=0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker = p.workers[0]
        a = worker.assignment(0).assignment
        # A file with 1 usable sample in 4: the yield drops to 0.25, so 7 usable samples
        # still missing need ceil(7 × 1.1 / 1) = 8 assignments.
        p.upload_for(worker, a, num_nonzero=1)
        more = 0
        while worker.assignment(0).assignment is not None:
            more += 1
        assert more == 8
    finally:
        p.stop()


def test_workers_ahead_within_the_async_bound(pool):
    steps = []
    for worker in pool.workers:  # each holds at most 8 open assignments
        while (r := worker.assignment(0)).assignment is not None:
            steps.append(r.assignment.step)
    # async level 2 would allow steps 0..2 from policy 0; max_ahead 1 (default) stops at 1
    assert steps == [0] * 5 + [1] * 5
    old = pool.workers[1]
    pool.trainer.announce_checkpoint(3, BLAKE)
    r = old.assignment(0)
    assert r.assignment is None and "too old" in r.reason


def test_max_ahead_up_to_the_async_bound(tmp_path):
    p = make_pool(tmp_path, max_ahead=5)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        steps = []
        for worker in p.workers:
            while (r := worker.assignment(0)).assignment is not None:
                steps.append(r.assignment.step)
        assert steps == [0] * 5 + [1] * 5 + [2] * 5  # the async bound (2) still caps it
    finally:
        p.stop()


@pytest.mark.slow
def test_lapsed_assignment_is_reissued_and_counted(tmp_path):
    # Deadlines of 3 s: on a loaded machine the loop that takes the step's whole share
    # may take over a second, and none may lapse before the step is seen covered.
    p = make_pool(tmp_path, async_level=0, assignment_seconds=3.0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        slow, fast = p.workers
        first = []
        while (r := slow.assignment(0)).assignment is not None:
            first.append(r.assignment)
        assert fast.assignment(0).assignment is None  # the step is covered
        time.sleep(max(a.deadline for a in first) - time.time() + 0.2)
        # All lapsed: the step needs them again, and fast gets them.
        again = fast.assignment(0).assignment
        assert again is not None and again.step == 0 and again.id not in {a.id for a in first}
        status = PoolClient(p.url, None).status()
        member = {m.address: m for m in status.members}
        assert member[slow.address].lapses == len(first)
        assert status.steps[0].lapsed_assignments == len(first)
        # A late file for a lapsed assignment is refused.
        assert "lapsed" in refused(lambda: p.upload_for(slow, first[0]), 409)
        assert p.ledger_problems() == []
    finally:
        p.stop()


@pytest.mark.slow
def test_dead_worker_assignments_are_reissued(tmp_path):
    # Dead after 6 missed half-second beats: the survivor, beating every ~0.1 s and once
    # more just before the status is read, has 2 s (4 beats) before it would count as
    # unhealthy: slack for a loaded machine (a 1 s margin once failed a CI run).
    p = make_pool(tmp_path, async_level=0, heartbeat_seconds=0.5, unhealthy_after=4, dead_after=6)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        gone, alive = p.workers
        a = gone.assignment(0).assignment
        deadline = time.time() + 4.5
        while time.time() < deadline:  # the survivor keeps heartbeating
            alive.heartbeat(0)
            p.trainer.heartbeat(0)
            time.sleep(0.1)
        alive.heartbeat(0)
        status = PoolClient(p.url, None).status()
        member = {m.address: m for m in status.members}
        assert member[gone.address].status == "dead"
        assert member[alive.address].status == "healthy"
        assert "declared dead" in refused(lambda: gone.heartbeat(0), 403)
        assert "declared dead" in refused(lambda: p.upload_for(gone, a), 403)
        assert status.steps[0].lapsed_assignments == 1
        # Registering again brings it back.
        gone.register("worker")
        gone.heartbeat(0)
    finally:
        p.stop()


# -- trainer and validator -------------------------------------------------------------------


def test_trainer_and_validator_flow(pool):
    worker, a = _assignment(pool)
    cheat, b = _assignment(pool, pool.workers[1])
    good = pool.upload_for(worker, a)
    bad = pool.upload_for(cheat, b)
    v = pool.validator
    first = v.next_for_validation()
    second = v.next_for_validation()
    assert {first.submission.file_hash, second.submission.file_hash} == {
        good.file_hash,
        bad.file_hash,
    }
    assert first.assignment.seed == assignment_seed(pool.secret(), first.assignment.id)
    assert v.next_for_validation().submission is None  # both handed out (leased)
    assert v.post_verdict(good.file_hash, True).state == "accepted"
    assert v.post_verdict(bad.file_hash, False, "toploc: chunk 3 mismatches").state == "rejected"
    assert "already accepted" in refused(lambda: v.post_verdict(good.file_hash, False), 409)
    # Rejected work is not offered to the trainer and cannot be marked trained.
    listed = [s.file_hash for s in pool.trainer.submissions_for_step(0).submissions]
    assert listed == [good.file_hash]
    assert "rejected" in refused(lambda: pool.trainer.mark_trained(0, [bad.file_hash]), 409)
    assert pool.trainer.mark_trained(0, [good.file_hash]) == 1
    assert pool.trainer.mark_trained(0, [good.file_hash]) == 0  # a restarted trainer: once
    assert "already trained" in refused(lambda: pool.trainer.mark_trained(1, [good.file_hash]), 409)
    status = PoolClient(pool.url, None).status()
    assert status.verdicts == {"accepted": 1, "rejected": 1, "soft": 0}
    assert [(c.worker, c.files, c.samples, c.tokens) for c in status.contributions] == [
        (worker.address, 1, 4, 8)
    ]
    assert pool.ledger_problems() == []


def _asked_in_background(call):
    """Run `call` in a thread; returns a function that joins it and gives (result, seconds)."""
    out: dict = {}

    def run() -> None:
        start = time.monotonic()
        out["result"] = call()
        out["seconds"] = time.monotonic() - start

    t = threading.Thread(target=run)
    t.start()

    def joined():
        t.join(timeout=30)
        return out["result"], out["seconds"]

    return joined


def test_a_waiting_validator_gets_the_file_uploaded_meanwhile(pool):
    # A long poll: held while nothing is there, answered when an upload comes.
    worker, a = _assignment(pool)
    joined = _asked_in_background(lambda: pool.validator.next_for_validation(wait=8))
    time.sleep(0.3)
    sent = pool.upload_for(worker, a)
    handed, seconds = joined()
    assert handed.submission is not None and handed.submission.file_hash == sent.file_hash
    assert seconds < 6  # the upload ended the wait, not the 8 s
    # Nothing more comes: held for the wait, then answered empty.
    start = time.monotonic()
    assert pool.validator.next_for_validation(wait=0.5).submission is None
    assert time.monotonic() - start >= 0.45
    assert pool.ledger_problems() == []


def test_the_last_checkpoint_ends_a_validators_wait(pool):
    joined = _asked_in_background(lambda: pool.validator.next_for_validation(wait=8))
    time.sleep(0.3)
    pool.trainer.announce_checkpoint(0, BLAKE, final=True)
    handed, seconds = joined()
    assert handed.submission is None and seconds < 6
    # The run is over: nothing is held any more.
    start = time.monotonic()
    assert pool.validator.next_for_validation(wait=8).submission is None
    assert time.monotonic() - start < 6


@pytest.mark.parametrize("wait", ["-1", "10.5", "nan", "inf", "x", "1e400"])
def test_a_wait_out_of_bounds_is_refused(pool, wait):
    v = pool.validator
    detail = refused(lambda: v._send("POST", f"/v1/validation/next?wait={wait}"), 422)
    assert "wait" in detail


def test_only_so_many_requests_wait_at_once():
    from swarmrl.orchestrator.arrivals import Arrivals

    arrivals = Arrivals(max_waiters=1)
    seen = arrivals.count
    waiter = threading.Thread(target=arrivals.wait_past, args=(seen, 5.0))
    waiter.start()
    time.sleep(0.2)
    start = time.monotonic()
    assert arrivals.wait_past(seen, 5.0) is False  # the one place is taken: answered at once
    assert time.monotonic() - start < 1
    arrivals.notify()
    waiter.join(timeout=5)
    assert arrivals.wait_past(seen, 5.0) is True  # news since `seen`: no wait at all
    arrivals.close()
    assert arrivals.wait_past(arrivals.count, 5.0) is False


def test_validator_restart_resumes_pending(tmp_path):
    # A lease long enough that the second request surely falls inside it on a loaded
    # machine (at 0.5 s it once expired between two requests in CI).
    p = make_pool(tmp_path, validation_lease_seconds=2.0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker, a = _assignment(p)
        info = p.upload_for(worker, a)
        assert p.validator.next_for_validation().submission.file_hash == info.file_hash
        # The validator dies before its verdict: after the lease the file comes back.
        assert p.validator.next_for_validation().submission is None
        time.sleep(2.2)
        assert p.validator.next_for_validation().submission.file_hash == info.file_hash
    finally:
        p.stop()


def test_a_restarted_validator_gets_its_leased_file_back_at_once(tmp_path):
    # The default lease (600 s): a validator killed while judging, then started again,
    # registers again, and the file its previous process held is handed to it at once
    # (in a run a step may be waiting for that file).
    p = make_pool(tmp_path)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker, a = _assignment(p)
        info = p.upload_for(worker, a)
        assert p.validator.next_for_validation().submission.file_hash == info.file_hash
        assert p.validator.next_for_validation().submission is None  # leased
        # Another validator's registration gives back only its own leases.
        other = Identity.generate()
        with open(tmp_path / "allowlist", "a") as allowlist:
            allowlist.write(f"{other.address} validator\n")
        p.restart()  # the orchestrator reads its allowlist at start
        p.client(other).register("validator")
        assert p.client(other).next_for_validation().submission is None
        p.validator.register("validator")
        assert p.validator.next_for_validation().submission.file_hash == info.file_hash
        assert p.client(other).next_for_validation().submission is None  # leased again
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_checkpoint_announcements(pool):
    hb = pool.workers[0].heartbeat(0)
    assert (hb.step, hb.checkpoint.blake3, hb.async_level, hb.finished) == (0, BLAKE, 2, False)
    pool.trainer.announce_checkpoint(1, "cd" * 32)
    assert pool.trainer.announce_checkpoint(1, "cd" * 32).step == 1  # idempotent
    assert "another hash" in refused(lambda: pool.trainer.announce_checkpoint(1, BLAKE), 409)
    pool.trainer.announce_checkpoint(3, "ee" * 32)
    assert "older" in refused(lambda: pool.trainer.announce_checkpoint(2, "ee" * 32), 409)
    pool.trainer.announce_checkpoint(4, "ef" * 32, final=True)
    hb = pool.workers[0].heartbeat(4)
    assert hb.finished and hb.checkpoint.step == 4
    assert pool.workers[0].assignment(4).reason == "the run is finished"
    # A finished run resumed with more steps: the trainer announces the same checkpoint
    # as not final, and work goes on.
    pool.trainer.announce_checkpoint(4, "ef" * 32)
    assert not pool.workers[0].heartbeat(4).finished


def test_relays_register_and_are_announced(pool):
    relay = Identity.generate()
    allow = pool.tmp / "allowlist"
    allow.write_text(allow.read_text() + f"{relay.address} relay\n")
    pool.restart()  # the allowlist is read at start
    client = pool.client(relay)
    client.register("relay", url="http://127.0.0.1:9999")
    pool.trainer.register("trainer", url="http://127.0.0.1:9000")
    hb = pool.workers[0].heartbeat(0)
    assert hb.relays == ["http://127.0.0.1:9999"] and hb.origin == "http://127.0.0.1:9000"
    assert "only relays" in refused(lambda: pool.workers[0].register("worker", url="http://x"), 422)


# -- restart and status ----------------------------------------------------------------------


def test_restart_keeps_every_record(pool):
    worker, a = _assignment(pool)
    info = pool.upload_for(worker, a)
    pool.validator.post_verdict(info.file_hash, True)
    pool.trainer.mark_trained(0, [info.file_hash])
    _, open_a = _assignment(pool)
    before_status = PoolClient(pool.url, None).status()
    before = pool.ledger_state()
    pool.restart()
    assert pool.ledger_state() == before
    after_status = PoolClient(pool.url, None).status()
    strip = lambda s: s.model_dump(exclude={"members"})  # noqa: E731
    assert strip(after_status) == strip(before_status)
    # The open assignment can still be returned; the file can still be downloaded.
    pool.upload_for(worker, open_a)
    got = pool.trainer.download(info.file_hash, pool.tmp / "again.parquet")
    assert body_digest(got.read_bytes()) == info.file_hash
    # Seeds come from the same secret after the restart.
    _, c = _assignment(pool)
    assert c.seed == assignment_seed(pool.secret(), c.id)
    assert pool.ledger_problems() == []


def test_openapi_schema_lists_every_endpoint(pool):
    schema = httpx.get(pool.url + "/openapi.json").json()
    assert set(schema["paths"]) == {
        "/v1/status",
        "/v1/recipe",
        "/v1/signing",
        "/v1/register",
        "/v1/heartbeat",
        "/v1/assignments",
        "/v1/assignments/{assignment_id}/rollout",
        "/v1/steps/{step}/submissions",
        "/v1/submissions/{file_hash}/file",
        "/v1/submissions/{file_hash}/assignment",
        "/v1/submissions/trained",
        "/v1/steps/{step}/progress",
        "/v1/checkpoints",
        "/v1/validation/next",
        "/v1/verdicts",
        "/v1/pool/fund",
        "/v1/metrics",
        "/v1/dashboard",
        "/dashboard",
    }


def test_status_prints_the_pool(pool):
    worker, a = _assignment(pool)
    info = pool.upload_for(worker, a)
    pool.validator.post_verdict(info.file_hash, True)
    console = Console(record=True, width=200)
    render(PoolClient(pool.url, None).status(), console)
    out = console.export_text()
    for expected in (worker.address, pool.trainer.address, "step 0", "1 accepted", "4/8"):
        assert expected in out


# -- the trainer's own count -----------------------------------------------------------------


def test_trainer_count_replaces_the_workers_claims(tmp_path):
    # 8 usable samples needed, 4 per assignment. Two files each claim 4 usable samples:
    # by the claims the step is full. The trainer reads them and finds 1 usable sample
    # in all: issuance opens again, and the observed yield is the trainer's (1/8). No
    # cap on what a step is issued (max_read_ratio 0), so the yield alone decides.
    p = make_pool(tmp_path, async_level=0, max_read_ratio=0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker = p.workers[0]
        issued = [worker.assignment(0).assignment for _ in range(2)]
        files = [p.upload_for(worker, a).file_hash for a in issued]
        assert worker.assignment(0).assignment is None  # full by the claims
        status = p.trainer.report_progress(0, usable=1, read=8, files=files)
        assert status.usable_samples == 1 and status.read_samples == 8
        # 7 missing × 1.1 / (4 × 1/8) → 16 assignments (each worker holds at most 8).
        more = []
        for w in p.workers:
            while (r := w.assignment(0)).assignment is not None:
                more.append(r.assignment)
        assert len(more) == 16
        # A file the trainer has not read yet counts by its claim until it does.
        p.trainer.announce_checkpoint(1, BLAKE)
        worker = p.new_worker()
        a = worker.assignment(1).assignment
        assert a.step == 1
        c = p.upload_for(worker, a)
        public = PoolClient(p.url, None).status()
        step0 = next(st for st in public.steps if st.step == 0)
        assert step0.usable_samples == 1 and not step0.full
        assert next(st for st in public.steps if st.step == 1).usable_samples == 4
        p.trainer.report_progress(1, usable=0, read=4, files=[c.file_hash])
        assert (
            next(st for st in PoolClient(p.url, None).status().steps if st.step == 1).usable_samples
            == 0
        )
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_a_step_is_issued_what_the_trainer_reads_and_no_more(tmp_path):
    # 8 usable samples needed, 4 samples an assignment, the trainer reads at most 2 × 8:
    # the yield (0.5 before any file) asks for ceil(8 × 1.1 / 2) = 5 assignments, the
    # cap allows 16 / 4 = 4. Files are trainable at once (no validation); deadlines of
    # 3 s, as in the lapse test above.
    p = make_pool(
        tmp_path, async_level=0, max_read_ratio=2, validation_fraction=0.0, assignment_seconds=3.0
    )
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        first, second = p.workers
        issued = []
        while (r := first.assignment(0)).assignment is not None:
            issued.append(r.assignment)
        assert len(issued) == 4 and "need no more work" in r.reason
        # Three files come in holding nothing usable; unread, they still fill the cap.
        files = [p.upload_for(first, a, num_nonzero=0).file_hash for a in issued[:3]]
        assert second.assignment(0).assignment is None
        # The fourth lapses: it brings nothing, so its room is issued again, once.
        time.sleep(issued[3].deadline - time.time() + 0.3)
        again = second.assignment(0).assignment
        assert again is not None and again.step == 0
        assert second.assignment(0).assignment is None
        files.append(p.upload_for(second, again, num_nonzero=0).file_hash)
        # The trainer read all 16 samples, none with signal.
        status = p.trainer.report_progress(0, usable=0, read=16, files=files)
        assert status.usable_samples == 0 and status.read_samples == 16
        # Past the cap, everything read, nothing open, the step not full: one assignment
        # at a time.
        extra = second.assignment(0).assignment
        assert extra is not None and extra.step == 0
        assert first.assignment(0).assignment is None
        # Its file is in and unread: nothing more until the trainer has read it.
        last = p.upload_for(second, extra, num_nonzero=4).file_hash
        assert first.assignment(0).assignment is None
        # A trainer whose own read cap is higher (or that wants a full batch) reads it and
        # is still short: one more, never a stall.
        p.trainer.report_progress(0, usable=4, read=20, files=[last])
        assert first.assignment(0).assignment is not None
        assert first.assignment(0).assignment is None
        # The trainer says the step is full: nothing more.
        p.trainer.report_progress(0, usable=4, read=20, full=True)
        assert p.new_worker().assignment(0).assignment is None
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_the_trainers_report_says_full_once_it_has_read_its_cap(tmp_path):
    # The report that counts the file filling the trainer's read cap says the step is
    # full, so no assignment is issued between that report and the step's training.
    from swarmrl.trainer.pool_source import PoolStepCollector

    p = make_pool(tmp_path, async_level=0, max_read_ratio=2, validation_fraction=0.0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        collector = PoolStepCollector(0, 0, client=p.trainer, batch_samples=8, max_read_ratio=2.0)
        collector.all_rewards = [0.0] * 12
        collector.groups = [[None] * 2]  # 2 usable of 12 read: keep reading
        collector.report()
        assert not PoolClient(p.url, None).status().steps[0].full
        collector.all_rewards += [0.0] * 4  # 16 read = 2 × 8, with something to train on
        collector.report()
        status = PoolClient(p.url, None).status().steps[0]
        assert status.full and (status.usable_samples, status.read_samples) == (2, 16)
        assert p.workers[0].assignment(0).assignment is None
    finally:
        p.stop()


def test_trainer_says_the_step_is_full(tmp_path):
    p = make_pool(tmp_path, async_level=0)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker = p.workers[0]
        assert worker.assignment(0).assignment is not None
        status = p.trainer.report_progress(0, usable=2, read=4, full=True)
        assert status.full
        r = worker.assignment(0)
        assert r.assignment is None and "need no more work" in r.reason
    finally:
        p.stop()


def test_progress_reports_are_checked(pool):
    worker, a = _assignment(pool)
    sub = pool.upload_for(worker, a)
    assert "exceed" in refused(lambda: pool.trainer.report_progress(0, usable=5, read=4), 422)
    # Files of another step, or no submission at all, are not the step's.
    assert "no submissions of step 1" in refused(
        lambda: pool.trainer.report_progress(1, usable=0, read=4, files=[sub.file_hash]), 422
    )
    before = pool.ledger_state()
    refused(lambda: worker.report_progress(0, usable=0, read=4, files=[sub.file_hash]), 403)
    assert pool.ledger_state() == before


# -- the client across an orchestrator restart -----------------------------------------------


def test_client_retries_while_the_orchestrator_restarts(tmp_path):
    p = make_pool(tmp_path)
    try:
        port = int(p.url.rsplit(":", 1)[1])
        p.stop()
        again = OrchestratorThread(p.config, port=port)
        starter = threading.Timer(1.0, again.start)
        starter.start()
        try:
            # Sent while nothing listens: the client waits and retries until it answers.
            assert p.trainer.announce_checkpoint(0, BLAKE).checkpoint.step == 0
            a = p.workers[0].assignment(0).assignment
            assert a is not None
        finally:
            starter.join()
            again.stop()
    finally:
        p.stop()


def test_client_gives_up_after_its_retry_budget(tmp_path):
    p = make_pool(tmp_path)
    p.stop()
    client = PoolClient(p.url, p.keys["trainer"], retry_seconds=1.0)
    started = time.monotonic()
    with pytest.raises(PoolUnreachable, match="unreachable"):
        client.heartbeat(0)
    assert time.monotonic() - started < 10
