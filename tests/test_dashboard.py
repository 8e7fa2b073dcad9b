"""The dashboard's data on a live orchestrator (loopback, real HTTP): the trainer's step
metrics are kept in the ledger and refused from anyone else or oversized; the page and
its assets are served from the package alone; `/v1/dashboard` agrees with the ledger on
members' files, verdicts by check, slashings and each checkpoint's spread.

The page itself, in a real browser, is `test_dashboard_browser.py`."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import func, select

from pool_fixtures import loopback_client, make_pool, rollout_file, signed_raw
from swarmrl.identity import Identity
from swarmrl.ledger import Ledger, Submission
from swarmrl.ledger.models import CheckpointArrival, TrainingMetrics
from swarmrl.protocol import PoolClient, PoolRefused
from swarmrl.protocol import models as api
from swarmrl.protocol.models import failed_check

BLAKE = "ab" * 32


def report(step: int, **changes) -> api.MetricsReport:
    fields = {
        "step": step,
        "reward": 0.25 + step / 10,
        "task_reward": 0.5,
        "length_error": None,
        "grad_norm": 0.03,
        "clip_ratio": 0.002,
        "entropy": 1.5,
        "staleness_mean": 0.5,
        "staleness_max": 1,
        "samples": 8,
        "step_seconds": 2.5,
    }
    return api.MetricsReport(**(fields | changes))


def dashboard(pool) -> dict:
    with loopback_client(pool.url) as http:
        r = http.get("/v1/dashboard")
    assert r.status_code == 200, r.text
    return r.json()


def refusal(call) -> PoolRefused:
    with pytest.raises(PoolRefused) as info:
        call()
    return info.value


@pytest.mark.slow  # an orchestrator restarted
def test_the_trainers_step_metrics_are_kept_and_survive_a_restart(tmp_path):
    pool = make_pool(tmp_path)
    try:
        pool.trainer.report_metrics(report(0))
        pool.trainer.report_metrics(report(1, length_error=12.5))
        # A restarted trainer reports step 1 again: the row is replaced, not doubled.
        pool.trainer.report_metrics(report(1, reward=0.9, length_error=11.0))
        pool.restart()
        curves = dashboard(pool)["curves"]
        assert [(c["step"], c["reward"], c["length_error"]) for c in curves] == [
            (0, 0.25, None),
            (1, 0.9, 11.0),
        ]
        ledger = Ledger(pool.config.ledger)
        try:
            with ledger.session() as s:
                assert s.scalar(select(func.count()).select_from(TrainingMetrics)) == 2
        finally:
            ledger.close()
    finally:
        pool.stop()


def test_metrics_from_anyone_but_the_trainer_or_oversized_are_refused(tmp_path):
    pool = make_pool(tmp_path)
    try:
        worker, validator = pool.workers[0], pool.validator
        assert refusal(lambda: worker.report_metrics(report(0))).code == "wrong_role"
        assert refusal(lambda: validator.report_metrics(report(0))).code == "wrong_role"
        stranger = PoolClient(pool.url, Identity.generate())
        assert refusal(lambda: stranger.report_metrics(report(0))).code == "not_registered"
        body = json.dumps(report(0).model_dump()).encode()
        # Unsigned: refused at the gate, before any parse.
        with loopback_client(pool.url) as http:
            r = http.post("/v1/metrics", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 401, r.text
        # Over the 1 MiB body limit, even from the trainer.
        padded = body[:-1] + b', "pad": "' + b"x" * (1 << 20) + b'"}'
        r = signed_raw(pool.url, pool.keys["trainer"], "POST", "/v1/metrics", padded)
        assert (r.status_code, r.json()["code"]) == (413, "too_large"), r.text
        # Not finite, out of range, unknown field: refused by the typed model.
        for bad in (b"NaN", b"1e400", b"-1"):
            r = signed_raw(
                pool.url,
                pool.keys["trainer"],
                "POST",
                "/v1/metrics",
                body.replace(b'"grad_norm": 0.03', b'"grad_norm": ' + bad),
            )
            assert r.status_code in (400, 422) and r.json()["code"] == "invalid", (bad, r.text)
        r = signed_raw(
            pool.url, pool.keys["trainer"], "POST", "/v1/metrics", body[:-1] + b', "x": 1}'
        )
        assert (r.status_code, r.json()["code"]) == (422, "invalid"), r.text
        assert dashboard(pool)["curves"] == []
    finally:
        pool.stop()


def test_the_page_and_its_assets_come_from_the_package_alone(tmp_path):
    pool = make_pool(tmp_path, workers=0)
    try:
        with loopback_client(pool.url) as http:
            pages = [http.get(path) for path in ("/", "/dashboard")]
            assets = {
                name: http.get(f"/dashboard/{name}") for name in ("dashboard.js", "dashboard.css")
            }
        assert pages[0].content == pages[1].content
        html = pages[0].text
        for page in pages:
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            # No inline or foreign script may run, should hostile text ever become markup.
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        # Everything it loads is on this server: no CDN, nothing from the internet.
        loaded = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert loaded and all(u.startswith("/") for u in loaded), loaded
        assert "<script>" not in html
        for name, r in assets.items():
            assert r.status_code == 200 and len(r.content) > 500, name
        assert assets["dashboard.js"].headers["content-type"].startswith("text/javascript")
        # The script never turns data into markup.
        assert "innerHTML" not in assets["dashboard.js"].text
        assert "insertAdjacentHTML" not in assets["dashboard.js"].text
    finally:
        pool.stop()


@pytest.mark.slow  # two staked workers, uploads, verdicts, two checkpoints
def test_the_dashboard_agrees_with_the_ledger(tmp_path):
    owner = Identity.generate()
    pool = make_pool(tmp_path, workers=0, owner=owner.address, min_stake=5.0)
    try:
        with PoolClient(pool.url, owner) as funder:
            workers = []
            for _ in range(2):
                w = pool.client(Identity.generate())
                funder.fund(w.address, 5.0)
                w.register("worker")
                workers.append(w)
        honest, cheat = workers
        pool.trainer.announce_checkpoint(0, BLAKE)
        for w in workers:
            w.heartbeat(0)
            w.heartbeat(0)  # held already: no second arrival
        files = {}
        for w in workers:
            a = w.assignment(0).assignment
            assert a is not None
            files[w.address] = w.upload(
                a.id, rollout_file(tmp_path / f"{a.id}.parquet", w.address, a)
            )
        reason = "rejected: toploc: sample 0: 40 exponent mismatches <img src=x>"
        for _ in range(2):
            task = pool.validator.next_for_validation().submission
            assert task is not None
            if task.worker == cheat.address:
                pool.validator.post_verdict(task.file_hash, False, reason)
            else:
                pool.validator.post_verdict(task.file_hash, True, "accepted: 9 checks passed")
        pool.trainer.announce_checkpoint(1, "cd" * 32)
        honest.heartbeat(1)
        pool.trainer.report_metrics(report(0))
        # A SHARDCAST server reports what it served; a beat without the figure keeps it.
        pool.trainer.heartbeat(None, bytes_served=4_270_000)
        pool.trainer.heartbeat(None)

        d = dashboard(pool)
        assert d["status"] == json.loads(pool.trainer.status().model_dump_json())
        mine = {m["address"]: m for m in d["members"]}
        reached = mine[honest.address].pop("reached_seconds")
        assert reached is not None and reached >= 0
        assert mine[honest.address] | {"samples_per_second": None} == {
            "address": honest.address,
            "uploaded": 1,
            "accepted": 1,
            "rejected": 0,
            "voided": 0,
            "trained": 0,
            "samples": files[honest.address].num_samples,
            "samples_per_second": None,
            "holds": 1,
            "bytes_served": None,
        }
        assert (mine[cheat.address]["rejected"], mine[cheat.address]["holds"]) == (1, 0)
        assert mine[pool.trainer.address]["bytes_served"] == 4_270_000
        assert d["by_check"] == {"toploc": 1}
        assert d["verdicts"] == [
            {"step": 0, "outcome": "accepted", "check": None, "files": 1},
            {"step": 0, "outcome": "rejected", "check": "toploc", "files": 1},
        ]
        (slashing,) = d["status"]["slashings"]
        assert (slashing["address"], slashing["slashed"], slashing["reason"]) == (
            cheat.address,
            5.0,
            reason,
        )
        spread = {c["step"]: c for c in d["checkpoints"]}
        # Checkpoint 0 reached both workers, 1 the honest one (the cheat is ejected).
        assert (spread[0]["held_by"], spread[1]["held_by"]) == ({"worker": 2}, {"worker": 1})
        for c in spread.values():
            assert 0 <= c["first_seconds"] <= c["last_seconds"] < 60
        assert d["run"]["step"] == 1 and d["run"]["steps_per_minute"] > 0
        assert [c["step"] for c in d["curves"]] == [0]
        ledger = Ledger(pool.config.ledger)
        try:
            with ledger.session() as s:
                assert s.scalar(select(func.count()).select_from(CheckpointArrival)) == 3
                uploaded = s.scalar(select(func.sum(Submission.num_samples)))
        finally:
            ledger.close()
        assert sum(m["samples"] for m in d["members"]) == uploaded
    finally:
        pool.stop()


def test_failed_check_names_the_check_of_a_reject():
    assert failed_check("rejected: sampling: sample 3: too likely") == "sampling"
    assert failed_check("unusable: the file is not parquet") == "unusable"
    assert failed_check("") == ""
