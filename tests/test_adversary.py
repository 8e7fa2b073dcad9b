"""Each adversary kind is caught: a real orchestrator on loopback issues the assignment,
the cheater generates it with the worker's own code and its one change, uploads it, and
the validator's own `judge_submission` judges it against the honest policy; the
rejection slashes and ejects the cheater. An honest worker on the same path is accepted
(the control: the checks catch the cheat, not the set-up)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from pool_fixtures import make_pool
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import attach_proofs
from swarmrl.identity import Identity, load_identity
from swarmrl.inference.adversary import BestOfN, Copy, behaviour
from swarmrl.inference.kinds import KINDS, parse_kinds
from swarmrl.inference.worker import generate_assignment
from swarmrl.ledger import Ledger, check_ledger
from swarmrl.ledger.models import Contribution, Submission
from swarmrl.protocol import PoolClient, PoolRefused
from swarmrl.protocol.membership import ejected
from swarmrl.rollouts import write_rollouts
from swarmrl.tasks.registry import build_task
from swarmrl.validator.checks import CHECK_ORDER
from swarmrl.validator.service import judge_submission
from swarmrl.validator.settings import ValidatorSettings

RUN = "adv"
STAKE = 5.0
# The check each kind must fail (among others it may fail too).
CAUGHT_BY = {
    "wrong_model": "toploc",
    "temperature": "logprobs",
    "best_of_n": "sampling",
    "inflated_rewards": "values",
    "copied_proofs": "toploc",
    "garbage": "termination",
    "copy": "assignment",
}


def staked_worker(pool, owner: Identity) -> PoolClient:
    """A worker funded by the pool's owner, registered by locking its stake."""
    worker = pool.client(Identity.generate())
    with PoolClient(pool.url, owner) as funder:
        funder.fund(worker.address, STAKE)
    worker.register("worker")
    pool.workers.append(worker)
    return worker


class HeldPolicy:
    """The claimed checkpoint, already loaded (the validator process fetches it through
    SHARDCAST; here the test holds it)."""

    def __init__(self, model, tok) -> None:
        self.loaded = (model, tok)

    def get(self, step: int):
        return self.loaded


def test_every_kind_has_a_check_that_catches_it():
    assert set(CAUGHT_BY) == set(KINDS)


def test_kinds_parse_from_the_command_line():
    assert parse_kinds("copy, garbage,copy") == ["copy", "garbage"]
    for bad in ("", "wrong_model,lazy"):
        with pytest.raises(ValueError, match="one or more of wrong_model"):
            parse_kinds(bad)


@pytest.fixture(scope="module")
def setting(warm_model_dir: Path, tmp_path_factory):
    cfg = load_config(
        overrides={
            "run_name": RUN,
            "output_dir": str(tmp_path_factory.mktemp("out")),
            "worker.prompts_per_file": 1,
            "sampling.group_size": 4,
        }
    )
    return cfg, build_task(cfg.task)


def _file(cfg, task, worker, cheat, model_dir: Path, path: Path):
    """One assignment, generated and written the way the worker does it, then tampered."""
    model, tok = load_policy(model_dir)
    work = worker.assignment(0).assignment
    assert work is not None
    batch, meta = generate_assignment(
        cfg, cheat.policy(model), tok, task, work, 0, worker.address, cheat
    )
    attach_proofs(batch)
    write_rollouts(path, batch.columns, meta)
    cheat.tamper(path, meta)
    return work


@pytest.mark.slow
@pytest.mark.parametrize("kind", [None, *KINDS])
def test_a_cheater_is_caught_slashed_and_ejected(kind, setting, warm_model_dir, tmp_path):
    cfg, task = setting
    owner = Identity.generate()
    pool = make_pool(
        tmp_path,
        workers=0,
        run_id=RUN,
        prompts_per_assignment=1,
        group_size=4,
        batch_samples=64,
        owner=owner.address,
        min_stake=STAKE,
    )
    try:
        pool.trainer.announce_checkpoint(0, "0" * 64)
        honest, cheater = (staked_worker(pool, owner) for _ in range(2))
        if kind == "copy":
            # Another worker's file in the store, where the copier can read it.
            theirs = tmp_path / "theirs.parquet"
            work = _file(cfg, task, honest, behaviour(None, honest.address), warm_model_dir, theirs)
            honest.upload(work.id, theirs)
            # Unchanged, another worker's file is refused at upload: it names its worker.
            mine = cheater.assignment(0).assignment
            with pytest.raises(PoolRefused) as refused:
                cheater.upload(mine.id, theirs)
            assert refused.value.status == 422 and "worker_address" in refused.value.detail
        cheat = behaviour(kind, cheater.address, Path(pool.config.store))
        if isinstance(cheat, Copy):
            cheat.wait = 0.0
        if isinstance(cheat, BestOfN):
            cheat.n = 2  # the cheat is the same with 2 tries as with 4, at half the cost
        path = tmp_path / "cheat.parquet"
        work = _file(cfg, task, cheater, cheat, warm_model_dir, path)
        cheater.upload(work.id, path)

        policy, settings = HeldPolicy(*load_policy(warm_model_dir)), ValidatorSettings()
        handed = pool.validator.next_for_validation()
        if kind == "copy":  # the copied file first (uploaded first): accepted
            judged = judge_submission(pool.validator, handed, cfg, policy, settings, task)
            assert judged["status"] == "accepted", judged["reason"]
            handed = pool.validator.next_for_validation()
        assert handed.submission is not None and handed.submission.worker == cheater.address
        record = judge_submission(pool.validator, handed, cfg, policy, settings, task)
        status = pool.trainer.status()
        if kind is None:
            assert record["status"] == "accepted", record["reason"]
            assert status.slashings == []
            assert cheater.assignment(0).assignment is not None
            return
        assert record["status"] == "rejected", record
        assert CAUGHT_BY[kind] in record["failed_checks"], record["reason"]
        # The reject acts: the stake is slashed, and the worker is ejected.
        (slashing,) = status.slashings
        assert (slashing.address, slashing.slashed) == (cheater.address, STAKE)
        assert slashing.reason == record["reason"]
        assert slashing.file_hash == handed.submission.file_hash
        member = next(m for m in status.members if m.address == cheater.address)
        assert (member.status, member.stake, member.paid) == ("ejected", 0.0, 0.0)
        with pytest.raises(PoolRefused) as refused:
            cheater.assignment(0)
        assert ejected(refused.value), refused.value
    finally:
        pool.stop()


@pytest.mark.slow
def test_a_pool_with_two_cheaters_trains_on_honest_work_and_pays_it(two_cheaters_run):
    """`swarmrl run --adversary`: 2 honest workers and 2 cheaters of different kinds on
    loopback, several steps (`conftest.two_cheaters_run`). Both cheaters are rejected,
    slashed and ejected; none of their rejected or voided files is trained; the honest
    workers are credited exactly their accepted samples and paid; the ledger's books
    balance."""
    kinds = list(two_cheaters_run.kinds)
    proc = two_cheaters_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = two_cheaters_run.run
    summary = json.loads(run.summary.read_text())
    assert summary["final_step"] == 3 and summary["ledger_problems"] == []
    cheaters = {c["kind"]: c for c in summary["cheaters"]}
    assert set(cheaters) == set(kinds)
    for kind, c in cheaters.items():
        assert c["caught"] and c["ejected"] and c["slashed"] > 0, c
        # Named by the verdict; which check fails first may vary with the sample.
        assert c["check"] in CHECK_ORDER and c["reason"].startswith(f"rejected: {c['check']}: ")
        # The console said it: who, by which check, what was slashed.
        assert f"caught adversary-{kind} at" in proc.stderr, proc.stderr[-3000:]
    # An ejected cheater is not restarted, and its exit is no failure.
    assert all(summary["restarts"][f"adversary-{k}"] == 0 for k in kinds), summary["restarts"]
    # Caught mid-run (not after the final checkpoint), a cheater stops on its ejection.
    assert any(c["stopped_on_ejection"] for c in cheaters.values()), cheaters

    cheats = {c["address"] for c in cheaters.values()}
    honest = {load_identity(run.worker_dir(i) / "key").address for i in range(2)}
    ledger = Ledger(f"sqlite:///{run.ledger}")
    try:
        with ledger.session() as session:
            assert check_ledger(session) == []
            submissions = list(session.scalars(select(Submission)))
            credited = {c.file_hash: c for c in session.scalars(select(Contribution))}
    finally:
        ledger.close()
    theirs = [s for s in submissions if s.worker in cheats]
    assert {s.worker for s in theirs if s.state == "rejected"} == cheats
    for s in theirs:
        if s.state in ("rejected", "voided"):
            assert s.trained_step is None and s.file_hash not in credited, s.file_hash
    accounts = summary["accounts"]
    for address in honest:
        # Credited: files accepted by the validator, and files trained unchosen.
        mine = [s for s in submissions if s.worker == address]
        accepted = [
            s
            for s in mine
            if s.state == "accepted" or (s.state == "pending" and s.trained_step is not None)
        ]
        assert (
            sum(credited[s.file_hash].samples for s in mine if s.file_hash in credited)
            == sum(s.num_samples for s in accepted)
            > 0
        ), address
    for name in ("worker-0", "worker-1"):
        assert accounts[name]["status"] != "ejected" and accounts[name]["paid"] > 0, accounts
    for kind in kinds:
        assert accounts[f"adversary-{kind}"]["status"] == "ejected", accounts
