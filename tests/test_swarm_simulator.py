"""The swarm simulator's own logic (`benchmarks/swarmsim/`): events in time order, links
shared by their flows, the relay tree, the real `Pool` on the simulated clock, runs that
are a function of their seed, and no sample trained that the ledger does not hold live."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from swarmrl.ledger import Assignment, Heartbeat
from swarmsim.events import EventQueue, SimClock
from swarmsim.network import Uplink, tree_depths, tree_parents
from swarmsim.params import calibration
from swarmsim.pooldriver import PoolDriver, address_of
from swarmsim.swarm import Swarm


def test_events_run_in_time_order_then_schedule_order():
    clock = SimClock(start=100.0)
    q = EventQueue(clock)
    seen = []
    q.at(103.0, seen.append, "c")
    q.at(101.0, seen.append, "a")
    q.at(103.0, seen.append, "d")  # same time as "c": after it, as scheduled
    q.after(2.0, lambda: q.after(0.0, seen.append, "b2"))  # at 102, one more at 102
    q.at(102.0, seen.append, "b")
    q.run(until=102.5)
    assert seen == ["a", "b", "b2"] and clock.now == 102.5
    q.run(until=200.0)
    assert seen == ["a", "b", "b2", "c", "d"] and clock.now == 200.0
    with pytest.raises(ValueError, match="before now"):
        q.at(150.0, seen.append, "late")


def test_a_shared_uplink_splits_its_capacity_and_counts_its_bytes():
    clock = SimClock(start=0.0)
    q = EventQueue(clock)
    link = Uplink("relay", capacity=100.0, events=q)
    done: dict[str, float] = {}
    link.send(200.0, 1000.0, lambda: done.setdefault("a", clock.now))
    link.send(200.0, 1000.0, lambda: done.setdefault("b", clock.now))
    link.send(30.0, 10.0, lambda: done.setdefault("slow", clock.now))  # its own link: 10 B/s
    q.run(until=10.0)
    # A third each (the capped flow leaves 23 B/s unused) until the slow one is done at
    # 3 s with 100 B in each of a and b; then a half each: 100 B more in 2 s.
    assert done["slow"] == pytest.approx(3.0)
    assert done["a"] == pytest.approx(5.0) and done["b"] == done["a"]
    assert link.served_bytes == 430.0


def test_the_relay_tree_has_the_given_fan_out():
    parents = tree_parents(2 + 4 + 3, fanout=2)
    assert parents == [-1, -1, 0, 0, 1, 1, 2, 2, 3]
    assert tree_depths(parents) == [1, 1, 2, 2, 2, 2, 3, 3, 3]
    assert tree_parents(3, fanout=8) == [-1, -1, -1]


def test_the_pool_runs_on_the_injected_clock(tmp_path):
    """Every time the ledger records is the simulated clock's (a day from now, with no
    wall time passing), and a deadline passes when that clock says so."""
    clock = SimClock(start=2_000_000_000.0)
    d = PoolDriver({"assignment_seconds": 50.0, "speculate": False}, tmp_path, clock, seed=1)
    worker = address_of(1, "w")
    d.register(d.trainer, "trainer")
    d.register(worker)
    d.announce(0)
    clock.now += 5.0
    work = d.request(worker, 0).assignment
    assert work is not None and work.deadline == clock.now + 50.0
    clock.now += 7.0
    d.heartbeat(worker, 0)
    with d.ledger.session() as s:
        assert s.scalar(select(Heartbeat.last_at).where(Heartbeat.address == worker)) == clock.now
        assert s.get_one(Assignment, work.id).issued_at == clock.now - 7.0
    clock.now = work.deadline + 1.0
    d.heartbeat(worker, 0)
    d.pool.sweep()
    with d.ledger.session() as s:
        a = s.get_one(Assignment, work.id)
        assert a.state == "lapsed" and a.closed_at == clock.now
    d.close()


def run_small(tmp_path: Path, **over):
    p = replace(calibration(None, seed=over.pop("seed", 0), steps=2), warmup_steps=1, **over)
    clock = SimClock()
    driver = PoolDriver(
        p.pool_settings(), tmp_path / f"run{len(list(tmp_path.iterdir()))}", clock, p.seed
    )
    swarm = Swarm(p, driver, clock)
    fig = swarm.run()
    driver.close()
    return fig, swarm


@pytest.mark.slow  # three small runs: about 1 s each on an idle core
def test_a_run_is_a_function_of_its_seed_and_trains_only_live_samples(tmp_path):
    a, swarm = run_small(tmp_path)
    b, _ = run_small(tmp_path)
    assert a == b  # every figure, to the last event
    assert swarm.step == 3 and a.samples_trained == 3 * 128
    assert a.samples_trained <= a.samples_accepted
    assert sum(a.staleness.values()) == 2 * 128  # the measured steps' samples, each once
    assert all(0 <= k <= 2 for k in a.staleness)  # within the async bound
    c, _ = run_small(tmp_path, seed=7)
    assert c.step_seconds != a.step_seconds


def test_a_worker_fetching_in_the_background_generates_meanwhile(tmp_path):
    """`background_fetch` (the worker today): a worker holding a policy goes on generating
    while the next one downloads, so some samples come from the older one, still within
    the async bound and only live samples trained. Blocking (the calibrated worker), the
    same seed trains only what the bound lets it; both finish their steps."""
    runs = {}
    for bg in (False, True):
        fig, swarm = run_small(tmp_path, background_fetch=bg, steps=4)
        assert swarm.step == 5 and fig.samples_trained == 5 * 128
        assert fig.samples_trained <= fig.samples_accepted
        assert all(0 <= k <= 2 for k in fig.staleness)
        runs[bg] = fig
    assert runs[True] != runs[False]  # the loop differs, so does the run


@pytest.mark.slow  # one small run
def test_a_validated_cheater_is_caught_before_any_of_its_samples_is_trained(tmp_path):
    """Every file validated (a chosen file is trained only once accepted): the cheaters'
    first files are rejected, they are ejected, and none of their samples is trained."""
    fig, swarm = run_small(tmp_path, cheater_share=1.0, validation_fraction=1.0, max_seconds=30.0)
    assert set(fig.cheaters_caught) == {0, 1}
    assert fig.cheater_samples_trained == {} and fig.samples_trained == 0
    assert not any(w.alive for w in swarm.workers)  # ejected: every request refused
