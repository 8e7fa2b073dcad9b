"""Verdicts with consequences, over real HTTP on loopback with a real ledger (SQLite, and
PostgreSQL when available): stake to register, slashing and ejection on a reject, soft
invalidation, validation that workers cannot see, payouts when a step ends (once)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from rich.console import Console
from sqlalchemy import select

from pool_fixtures import BACKENDS, make_pool, rollout_file, signed_raw
from swarmrl.cli import main
from swarmrl.commands.status import render
from swarmrl.identity import Identity
from swarmrl.ledger import JournalEntry, Ledger
from swarmrl.protocol import PoolClient, PoolRefused
from swarmrl.protocol import models as api
from swarmrl.protocol.membership import Membership, ejected

BLAKE = "ab" * 32
# Near zero, not zero: nothing is chosen at the base rate, but the higher rates apply
# (a pool whose validation fraction is 0 validates nothing at all).
ALMOST_NEVER = 1e-12


def refused(call, status: int) -> str:
    with pytest.raises(PoolRefused) as info:
        call()
    assert info.value.status == status, info.value
    return info.value.detail


def member(pool, address: str) -> api.Member:
    return next(m for m in PoolClient(pool.url, None).status().members if m.address == address)


def take(worker: PoolClient, step: int = 0) -> api.AssignmentInfo:
    a = worker.assignment(step).assignment
    assert a is not None
    return a


def chosen(pool) -> set[str]:
    """The files the validator is handed now (each then leased)."""
    out = set()
    while (task := pool.validator.next_for_validation()).submission is not None:
        out.add(task.submission.file_hash)
    return out


@pytest.fixture
def owner():
    return Identity.generate()


def staked_pool(tmp_path, backend, owner, **overrides):
    settings = {
        "owner": owner.address,
        "min_stake": 5.0,
        "validation_fraction": ALMOST_NEVER,
        "new_member_files": 0,
        "batch_samples": 64,
    }
    p = make_pool(tmp_path, backend, workers=0, **(settings | overrides))
    p.trainer.announce_checkpoint(0, BLAKE)
    return p


def staked_worker(pool, owner, amount: float = 5.0) -> PoolClient:
    worker = pool.client(Identity.generate())
    PoolClient(pool.url, owner).fund(worker.address, amount)
    worker.register("worker")
    pool.workers.append(worker)
    return worker


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_registers_by_locking_its_stake(tmp_path, backend, owner, capsys, caplog):
    p = staked_pool(tmp_path, backend, owner)
    try:
        worker = p.client(Identity.generate())
        before = p.ledger_state()
        detail = refused(lambda: worker.register("worker"), 402)
        assert "stake of 5" in detail and "5 short" in detail and "swarmrl pool fund" in detail
        # Only the owner funds; a worker funding itself changes nothing.
        assert "not the pool owner" in refused(lambda: worker.fund(worker.address, 100.0), 403)
        assert p.ledger_state() == before
        # The owner's CLI: 3 is not enough, 4 more is.
        key = tmp_path / "owner.key"
        key.write_text(owner.key_hex())
        key.chmod(0o600)
        fund = ["pool", "fund", "--orchestrator", p.url, "--key", str(key), worker.address]
        caplog.set_level(logging.INFO)
        assert main([*fund, "3"]) == 0
        assert "balance 3" in capsys.readouterr().out
        assert not [r for r in caplog.records if r.name == "httpx"]  # no line per request
        assert "2 short" in refused(lambda: worker.register("worker"), 402)
        assert main([*fund, "4"]) == 0
        joined = worker.register("worker")
        assert (joined.balance, joined.stake) == (2.0, 5.0)
        shown = member(p, worker.address)
        assert (shown.balance, shown.stake, shown.paid, shown.unpaid) == (2.0, 5.0, 0.0, 0.0)
        # Registering again (e.g. after being declared dead) locks nothing more.
        assert worker.register("worker").stake == 5.0
        # No balance grows past what the ledger's integers hold.
        rich = PoolClient(p.url, owner)
        assert rich.fund(owner.address, 1e9).balance == 1e9
        assert "the most one balance may hold" in refused(lambda: rich.fund(owner.address, 1), 422)
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_a_worker_started_before_it_is_funded_registers_once_funded(tmp_path, owner, caplog):
    # `swarmrl run` starts its workers and funds them while they import; an operator may
    # fund a worker after starting it too. Its membership waits, and says why.
    p = staked_pool(tmp_path, "sqlite", owner)
    identity = Identity.generate()
    joined: list[api.HeartbeatResponse] = []
    waiting = Membership(p.url, identity, "worker", retry_base=0.05, retry_cap=0.2)
    caplog.set_level(logging.WARNING, logger="swarmrl.membership")
    thread = threading.Thread(target=lambda: joined.append(waiting.start()), daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 10
        while "waiting to be funded" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "waiting to be funded" in caplog.text and "5 short" in caplog.text
        assert not joined and thread.is_alive()
        PoolClient(p.url, owner).fund(identity.address, 5.0)
        thread.join(10)
        assert joined
        assert member(p, waiting.address).stake == 5.0
        # Any other refusal still ends the start: a trusted role this pool does not allow.
        outsider = Membership(p.url, Identity.generate(), "validator", retry_base=0.05)
        with pytest.raises(PoolRefused):
            outsider.start()
    finally:
        waiting.stop()
        p.stop()


def test_a_pool_without_an_owner_cannot_fund_and_a_closed_pool_needs_no_stake(tmp_path):
    p = make_pool(tmp_path, validation_fraction=0.0)  # min_stake 0: free registration
    try:
        assert all(m.stake == 0 for m in PoolClient(p.url, None).status().members)
        assert "no owner" in refused(lambda: p.trainer.fund(p.workers[0].address, 1.0), 403)
    finally:
        p.stop()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reject_slashes_voids_taints_and_ejects(tmp_path, backend, owner):
    # The cheat's first file is checked (new-member rate); its next two are not.
    p = staked_pool(
        tmp_path, backend, owner, new_member_files=1, slash_fraction=0.6, pay_per_token=0.5
    )
    try:
        honest = staked_worker(p, owner)
        cheat = staked_worker(p, owner)
        honest_file = p.upload_for(honest, take(honest))  # checked too (its first)
        bad = p.upload_for(cheat, take(cheat))
        trained = p.upload_for(cheat, take(cheat))
        untrained = p.upload_for(cheat, take(cheat))
        still_open = take(cheat)
        assert chosen(p) == {honest_file.file_hash, bad.file_hash}
        p.validator.post_verdict(honest_file.file_hash, True)
        listed = {s.file_hash for s in p.trainer.submissions_for_step(0).submissions}
        assert listed == {honest_file.file_hash, trained.file_hash, untrained.file_hash}
        assert p.trainer.mark_trained(0, [honest_file.file_hash, trained.file_hash]) == 2

        reason = "toploc: 3 of 4 chunks mismatch (claimed policy 0)"
        assert p.validator.post_verdict(bad.file_hash, False, reason).state == "rejected"

        status = PoolClient(p.url, None).status()
        [caught] = status.slashings
        assert (caught.address, caught.step, caught.file_hash, caught.reason) == (
            cheat.address,
            0,
            bad.file_hash,
            reason,
        )
        assert (caught.slashed, caught.voided_files, caught.tainted_files) == (3.0, 1, 1)
        assert caught.tainted_steps == [0]
        shown = member(p, cheat.address)
        # 3 of 5 slashed, 2 back to its balance; its trained work, unpaid, is forfeited.
        assert (shown.status, shown.balance, shown.stake, shown.paid, shown.unpaid) == (
            "ejected",
            2.0,
            0.0,
            0.0,
            0.0,
        )
        # Untrained work is voided: never listed, never trainable.
        listed = {s.file_hash for s in p.trainer.submissions_for_step(0).submissions}
        assert listed == {honest_file.file_hash, trained.file_hash}
        assert "voided" in refused(lambda: p.trainer.mark_trained(0, [untrained.file_hash]), 409)
        # Ejected: every route answers 403 with the code "ejected", which members stop on.
        for call in (
            lambda: cheat.heartbeat(0),
            lambda: cheat.assignment(0),
            lambda: p.upload_for(cheat, still_open),
            lambda: cheat.register("worker"),
        ):
            with pytest.raises(PoolRefused) as info:
                call()
            assert (info.value.status, info.value.code) == (403, "ejected"), info.value
            assert ejected(info.value) and reason in info.value.detail
        # Its open assignment went back to the pool: the honest worker gets the work.
        assert take(honest).step == 0
        # `swarmrl status` shows who was caught, on which check, and what it cost.
        console = Console(record=True, width=250)
        render(PoolClient(p.url, None).status(), console)
        shown_text = console.export_text()
        assert "slashed and ejected" in shown_text and "toploc: 3 of 4 chunks" in shown_text
        # The step ends: the honest worker is paid (4 samples + 0.5 × 8 tokens); the
        # cheat's trained file stays tainted and unpaid.
        p.trainer.announce_checkpoint(1, BLAKE)
        assert member(p, honest.address).paid == 8.0
        assert member(p, cheat.address).paid == 0.0
        assert p.ledger_problems() == []
    finally:
        p.stop()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_soft_invalidation_voids_only_that_work(tmp_path, backend, owner):
    p = staked_pool(tmp_path, backend, owner, soft_invalidation_files=1, async_level=1)
    try:
        worker = staked_worker(p, owner)
        earlier = p.upload_for(worker, take(worker))
        assert chosen(p) == set()  # the base rate chooses nothing here
        p.trainer.announce_checkpoint(1, BLAKE)
        p.trainer.announce_checkpoint(2, BLAKE)
        # Stale: samples claiming policy 0 for step 2, beyond the bound (>= 1): recorded
        # void at upload, no slash.
        a = take(worker, 2)
        stale = worker.upload(a.id, rollout_file(tmp_path / "stale.parquet", worker.address, a, 0))
        assert stale.state == "voided"
        # After a soft invalidation its next file is checked (soft_invalidation_files=1),
        # the one after is not.
        checked = p.upload_for(worker, take(worker, 2))
        assert chosen(p) == {checked.file_hash}
        unchecked = p.upload_for(worker, take(worker, 2))
        assert chosen(p) == set()
        # The validator could not fetch the file's checkpoint: a soft verdict voids it.
        skipped = "skipped: checkpoint 2 cannot be fetched"
        assert p.validator.post_verdict(checked.file_hash, False, skipped, soft=True).state == (
            "voided"
        )
        body = f'{{"file_hash": "{unchecked.file_hash}", "accepted": true, "soft": true}}'
        r = signed_raw(p.url, p.keys["validator"], "POST", "/v1/verdicts", body.encode())
        assert r.status_code == 422 and "accepted must be false" in r.json()["detail"]
        shown = member(p, worker.address)
        assert (shown.status, shown.stake) == ("healthy", 5.0)
        status = PoolClient(p.url, None).status()
        assert status.slashings == [] and status.verdicts["soft"] == 1
        assert [s.file_hash for s in p.trainer.submissions_for_step(2).submissions] == [
            unchecked.file_hash
        ]
        assert [s.file_hash for s in p.trainer.submissions_for_step(0).submissions] == [
            earlier.file_hash
        ]
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_late_work_is_void_and_checked_more_often_after(tmp_path, owner):
    p = staked_pool(tmp_path, "sqlite", owner, assignment_seconds=0.3, soft_invalidation_files=1)
    try:
        worker = staked_worker(p, owner)
        late = take(worker)
        time.sleep(0.6)
        detail = refused(lambda: p.upload_for(worker, late), 409)
        assert "deadline" in detail or "lapsed" in detail
        assert member(p, worker.address).lapses == 1
        on_time = p.upload_for(worker, take(worker))
        assert chosen(p) == {on_time.file_hash}
        assert member(p, worker.address).stake == 5.0
        assert p.ledger_problems() == []
    finally:
        p.stop()


def test_new_members_are_checked_at_the_higher_rate(tmp_path):
    p = make_pool(tmp_path, validation_fraction=ALMOST_NEVER, new_member_files=2, workers=1)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker = p.workers[0]
        files = [p.upload_for(worker, take(worker)).file_hash for _ in range(3)]
        assert chosen(p) == set(files[:2])
    finally:
        p.stop()
    # A pool that validates nothing does not validate new members either.
    (tmp_path / "none").mkdir()
    p = make_pool(tmp_path / "none", validation_fraction=0.0, workers=1)
    p.trainer.announce_checkpoint(0, BLAKE)
    try:
        worker = p.workers[0]
        p.upload_for(worker, take(worker))
        assert chosen(p) == set()
    finally:
        p.stop()


def _visible(pool, worker: PoolClient, owner) -> list[dict]:
    """What a worker sees around one upload that fills step 0: the upload's answer, the
    next assignment request, a heartbeat (volatile ids, hashes and times left out)."""
    a = take(worker)
    info = pool.upload_for(worker, a)
    answer = worker.assignment(0)
    beat = worker.heartbeat(0)
    return [
        info.model_dump(exclude={"file_hash", "assignment_id", "worker"}),
        answer.model_dump(exclude={"assignment"}) | {"issued": answer.assignment is not None},
        beat.model_dump(),
    ]


def test_a_chosen_file_waits_for_its_verdict_unseen_by_its_worker(tmp_path, owner):
    # The same upload in two pools: chosen for validation in one, not in the other.
    seen, trainers = [], []
    for name, fraction in (("chosen", 1.0), ("unchosen", 0.0)):
        (tmp_path / name).mkdir()
        p = make_pool(tmp_path / name, validation_fraction=fraction, workers=1, batch_samples=4)
        p.trainer.announce_checkpoint(0, BLAKE)
        try:
            seen.append(_visible(p, p.workers[0], owner))
            listed = p.trainer.submissions_for_step(0).submissions
            trainers.append(listed)
            step = next(s for s in PoolClient(p.url, None).status().steps if s.step == 0)
            # Its claimed samples count as coming: the step is full either way.
            assert step.full and step.usable_samples == 4
            if fraction == 1.0:
                assert listed == []  # the trainer waits for the verdict
                task = p.validator.next_for_validation().submission
                with pytest.raises(PoolRefused, match="awaits its verdict"):
                    p.trainer.mark_trained(0, [task.file_hash])
                p.validator.post_verdict(task.file_hash, True)
                assert [s.file_hash for s in p.trainer.submissions_for_step(0).submissions] == [
                    task.file_hash
                ]
                assert p.trainer.mark_trained(0, [task.file_hash]) == 1
            assert p.ledger_problems() == []
        finally:
            p.stop()
    assert seen[0] == seen[1]
    assert len(trainers[1]) == 1 and trainers[0] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_work_is_paid_once_when_its_step_ends(tmp_path, backend, owner):
    p = staked_pool(tmp_path, backend, owner, pay_per_sample=0.25, pay_per_token=0.125)
    try:
        worker = staked_worker(p, owner)
        files = [p.upload_for(worker, take(worker)) for _ in range(2)]
        used = files[0].file_hash
        assert p.trainer.mark_trained(0, [used]) == 1
        # Credited when trained; paid once the step ends.
        assert member(p, worker.address).unpaid == 4 * 0.25 + 8 * 0.125
        p.trainer.announce_checkpoint(1, BLAKE)
        paid = member(p, worker.address)
        assert (paid.paid, paid.unpaid, paid.balance) == (2.0, 0.0, 2.0)
        # The same step reported done again, and again after a restart: paid once.
        p.trainer.announce_checkpoint(1, BLAKE)
        p.restart()
        p.trainer.announce_checkpoint(1, BLAKE)
        p.trainer.announce_checkpoint(2, BLAKE)
        again = member(p, worker.address)
        assert (again.paid, again.balance, again.stake) == (2.0, 2.0, 5.0)
        ledger = Ledger(p.config.ledger)
        try:
            with ledger.session() as s:
                payouts = s.scalars(
                    select(JournalEntry.file_hash).where(JournalEntry.kind == "payout")
                ).all()
        finally:
            ledger.close()
        assert payouts == [used]  # the untrained, unchecked file earns nothing
        assert p.ledger_problems() == []
    finally:
        p.stop()
