"""Hostile input to every parser of member-sent data: mutated honest request bodies,
headers and rollout files, sent signed to a live orchestrator. Nothing may crash it
(no 5xx), and the ledger stays consistent."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pool_fixtures import (
    EDITS,
    JSON_VALUES,
    loopback_client,
    make_pool,
    mutate,
    pool_id,
    rollout_file,
    signed_raw,
)
from swarmrl.config import RunConfig
from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.protocol import models as api
from swarmrl.protocol import recipe

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    owner = Identity.generate()
    p = make_pool(
        tmp_path_factory.mktemp("fuzz"), rate_per_second=1000, rate_burst=1000, owner=owner.address
    )
    p.keys["owner"] = owner
    p.trainer.announce_checkpoint(0, "ab" * 32)
    yield p
    assert p.ledger_problems() == []
    p.stop()


def answered(r: httpx.Response) -> None:
    """No crash (no 5xx), and a refusal's body says its kind (`api.Problem`)."""
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert api.Problem.model_validate_json(r.content).detail, r.text


# (method, path, who sends it, an honest body)
ENDPOINTS = [
    ("POST", "/v1/register", "worker", {"role": "worker"}),
    (
        "POST",
        "/v1/register",
        "worker",
        {
            "role": "worker",
            "recipe": {"run_id": "test", "prompts_per_assignment": 2, "group_size": 2},
        },
    ),
    (
        "POST",
        "/v1/register",
        "trainer",
        {"role": "trainer", "recipe": {"run_id": "test", "steps": 3, "batch_samples": 8}},
    ),
    # The whole recipe a default worker states (protocol/recipe.py).
    (
        "POST",
        "/v1/register",
        "worker",
        {
            "role": "worker",
            "recipe": recipe.of_run(RunConfig(), "worker").model_dump(exclude_none=True),
        },
    ),
    # A validator registering again gives back its validation leases (validation.py).
    (
        "POST",
        "/v1/register",
        "validator",
        {
            "role": "validator",
            "recipe": {"run_id": "test", "prompts_per_assignment": 2, "group_size": 2},
        },
    ),
    ("POST", "/v1/heartbeat", "worker", {"policy_step": 0}),
    ("POST", "/v1/heartbeat", "trainer", {"policy_step": 0, "bytes_served": 4_270_080}),
    ("POST", "/v1/assignments", "worker", {"policy_step": 0}),
    ("POST", "/v1/submissions/trained", "trainer", {"step": 0, "file_hashes": ["0" * 64]}),
    ("POST", "/v1/checkpoints", "trainer", {"step": 0, "blake3": "ab" * 32}),
    ("POST", "/v1/steps/0/progress", "trainer", {"usable": 0, "read": 0, "files": []}),
    (
        "POST",
        "/v1/metrics",
        "trainer",
        {
            "step": 0,
            "reward": 0.5,
            "task_reward": 0.75,
            "length_error": None,
            "grad_norm": 0.02,
            "clip_ratio": 0.01,
            "entropy": 1.2,
            "staleness_mean": 0.5,
            "staleness_max": 1,
            "samples": 8,
            "step_seconds": 3.5,
        },
    ),
    ("POST", "/v1/verdicts", "validator", {"file_hash": "0" * 64, "accepted": True, "reason": ""}),
    ("POST", "/v1/validation/next", "validator", {}),
    (
        "POST",
        "/v1/verdicts",
        "validator",
        {"file_hash": "0" * 64, "accepted": False, "reason": "", "soft": True},
    ),
    ("POST", "/v1/pool/fund", "owner", {"address": "0x" + "ab" * 20, "amount": 1.5}),
    ("POST", "/v1/pool/fund", "worker", {"address": "0x" + "ab" * 20, "amount": 1.5}),
]
MODELS = [
    api.RegisterRequest,
    api.Recipe,
    api.HeartbeatRequest,
    api.AssignmentRequest,
    api.MarkTrainedRequest,
    api.CheckpointAnnouncement,
    api.ProgressReport,
    api.MetricsReport,
    api.VerdictRequest,
    api.FundRequest,
]


def _sender(pool, who):
    if who == "owner":
        return pool.client(pool.keys["owner"])
    return {"worker": pool.workers[0], "trainer": pool.trainer, "validator": pool.validator}[who]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@settings(max_examples=200, deadline=None)
@given(edits=EDITS, honest=st.sampled_from([e[3] for e in ENDPOINTS]))
def test_request_models_parse_or_refuse(model, edits, honest):
    data = mutate(json.dumps(honest).encode(), edits)
    with contextlib.suppress(ValidationError):
        model.model_validate_json(data)


@pytest.mark.slow  # 40 signed requests per case to a live orchestrator
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e[1])
@FUZZ
@given(edits=EDITS)
def test_mutated_bodies_never_crash_the_server(pool, endpoint, edits):
    method, path, who, honest = endpoint
    body = mutate(json.dumps(honest).encode(), edits)
    r = signed_raw(pool.url, _sender(pool, who).identity, method, path, body)
    answered(r)


@pytest.mark.slow  # 40 signed requests per case to a live orchestrator
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e[1])
@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(
            [
                "role",
                "url",
                "recipe",
                "policy_step",
                "step",
                "file_hashes",
                "blake3",
                "final",
                "file_hash",
                "accepted",
                "reason",
                "seed",
                "soft",
                "address",
                "amount",
                "reward",
                "grad_norm",
            ]
        ),
        JSON_VALUES,
        max_size=4,
    )
)
def test_wrong_field_values_never_crash_the_server(pool, endpoint, fields):
    method, path, who, honest = endpoint
    body = json.dumps(honest | fields).encode()
    r = signed_raw(pool.url, _sender(pool, who).identity, method, path, body)
    answered(r)


@pytest.mark.slow  # 40 signed requests per case to a live orchestrator
@FUZZ
@given(
    header=st.sampled_from(["X-Pool", "X-Address", "X-Timestamp", "X-Nonce", "X-Signature"]),
    value=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=140),
)
def test_mutated_signature_headers_never_crash_the_server(pool, header, value):
    r = signed_raw(
        pool.url, pool.workers[0].identity, "POST", "/v1/heartbeat", b"{}", headers={header: value}
    )
    assert r.status_code in (200, 401, 426), r.text
    answered(r)
    # A signed GET is verified by the route's own dependency, not the body gate.
    lookup = f"/v1/submissions/{'0' * 64}/assignment"
    r = signed_raw(pool.url, pool.validator.identity, "GET", lookup, headers={header: value})
    assert r.status_code in (401, 404, 426), r.text
    answered(r)


@pytest.mark.slow  # 40 signed requests per case to a live orchestrator
@FUZZ
@given(
    query=st.text(max_size=40),
    segment=st.text(max_size=40),
    tail=st.sampled_from(["file", "assignment"]),
)
def test_mutated_paths_never_crash_the_server(pool, query, segment, tail):
    from urllib.parse import quote

    path = f"/v1/submissions/{quote(segment, safe='')}/{tail}?{quote(query, safe='=&')}"
    r = signed_raw(pool.url, pool.trainer.identity, "GET", path)
    answered(r)


@pytest.mark.slow  # 40 signed requests per case to a live orchestrator
@FUZZ
@given(edits=EDITS)
def test_mutated_rollout_files_never_crash_the_server(pool, edits):
    worker = pool.workers[1]
    open_ = getattr(pool, "fuzz_assignment", None)
    if open_ is None:  # the last one was closed: take the next (a later step once full)
        with loopback_client(pool.url) as http:
            status = http.get("/v1/status").json()
        open_ = worker.assignment(status["step"]).assignment
        if open_ is None:
            pool.trainer.announce_checkpoint(status["step"] + 1, "ab" * 32)
            open_ = worker.assignment(status["step"] + 1).assignment
        pool.fuzz_assignment = open_
    data = rollout_file(pool.tmp / "honest.parquet", worker.address, open_).read_bytes()
    data = mutate(data, edits)
    sha = body_digest(data)
    path = f"/v1/assignments/{open_.id}/rollout?sha256={sha}"
    headers = sign_request(worker.identity, "PUT", path, sha, pool=pool_id(pool.url))
    with loopback_client(pool.url) as http:
        r = http.put(path, content=data, headers=headers)
    assert r.status_code in (201, 422), r.text
    answered(r)
    pool.fuzz_assignment = None  # accepted, or lapsed by the refusal: take another
