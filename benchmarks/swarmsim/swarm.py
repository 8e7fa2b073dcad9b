"""The roles' loops as events around the real `Pool`: workers, relays, the trainer, the
validator, churn and cheaters, and the figures they leave.

A worker runs the loop of `inference/worker.py`: before each request it looks at the
newest announced checkpoint; a newer one that its relays list is fetched (a delta when
it holds the version before, full shards otherwise), then loaded: the loop blocks
meanwhile, or with `background_fetch` goes on generating with the policy it holds and
takes the new one at its next request; it asks the `Pool` for an assignment with the policy it holds, generates
it, and hands the file to its finisher (one file in flight: proofs, write, upload, off
the loop); with nothing to do it sleeps the answer's `retry_seconds`. A relay polls
its upstream every `relay_poll` seconds and mirrors a version it lacks (full shards,
and the delta when there is one) before listing it. The trainer runs `trainer.py`'s
loop: it polls the step's submissions, reads the new files, reports its count, and once
it has `batch_samples` usable samples (or read `max_read_ratio` times that) marks the
files it used trained, trains, saves, publishes and announces. The validator takes the
next chosen file, judges it, and rejects a cheater's file with `detect_probability`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from swarmrl.orchestrator.errors import Refusal
from swarmrl.protocol import models as api
from swarmrl.protocol.membership import HOLDING_BEATS
from swarmsim.events import EventQueue, SimClock
from swarmsim.network import Uplink, tree_depths, tree_parents
from swarmsim.params import MBIT, SwarmParams
from swarmsim.pooldriver import PoolDriver, address_of


@dataclass
class Worker:
    index: int
    address: str
    speed: float  # generation time factor (1 = the median worker)
    down: float  # bytes/s
    up: float
    cheater: bool
    alive: bool = True
    leaving: bool = False
    policy: int = -1  # the policy it generates with
    fetching: bool = False
    blocked: bool = False  # its loop waits for the fetch (blocking, or no policy yet)
    finisher_free: float = 0.0  # when the file in flight is delivered
    retry_fetch: float = 0.0
    life: int = 0  # bumped at death: stale events of a dead worker do nothing
    holding: int = 0  # assignments taken and not yet uploaded: it beats HOLDING_BEATS times a beat


@dataclass
class Relay:
    index: int
    depth: int
    parent: int  # -1: the origin
    upstream: Uplink
    uplink: Uplink
    down: float
    held: set[int] = field(default_factory=set)
    mirroring: bool = False


@dataclass
class FileRecord:
    worker: int
    step: int
    policy: int
    usable: int
    samples: int
    cheater: bool


@dataclass
class Figures:
    step_seconds: list[float] = field(default_factory=list)  # wait + train (metrics.jsonl)
    wait_seconds: list[float] = field(default_factory=list)
    cycle_seconds: list[float] = field(default_factory=list)  # announce to announce
    staleness: dict[int, int] = field(default_factory=dict)  # samples trained by staleness
    loaded_after: list[float] = field(default_factory=list)  # announcement to loaded
    fetch_seconds: list[float] = field(default_factory=list)
    samples_accepted: int = 0  # live files' samples (not rejected or voided)
    samples_trained: int = 0
    cheater_samples_trained: dict[int, int] = field(default_factory=dict)
    cheaters_caught: dict[int, float] = field(default_factory=dict)  # worker → time
    uploads: int = 0
    refused: int = 0
    measured_from: float = 0.0
    measured_to: float = 0.0


class Swarm:
    def __init__(self, p: SwarmParams, driver: PoolDriver, clock: SimClock) -> None:
        self.p = p
        self.driver = driver
        self.clock = clock
        self.q = EventQueue(clock)
        self.rng = np.random.default_rng(p.seed)
        self.fig = Figures()
        self.origin = Uplink("origin", p.origin_up_mbit * MBIT, self.q, p.transfer_overhead)
        self.origin_held: set[int] = set()
        parents = tree_parents(p.relays, p.fanout)
        self.relays: list[Relay] = []
        for i, (parent, depth) in enumerate(zip(parents, tree_depths(parents), strict=True)):
            up = self.origin if parent < 0 else self.relays[parent].uplink
            mine = Uplink(f"relay-{i}", p.relay_up_mbit * MBIT, self.q, p.transfer_overhead)
            self.relays.append(Relay(i, depth, parent, up, mine, p.relay_down_mbit * MBIT))
        self.workers: list[Worker] = []
        self.files: dict[str, FileRecord] = {}
        self.holders: dict[int, list[Relay]] = {}  # version → the relays listing it
        self.waiting: dict[int, list[Worker]] = {}  # version → workers with no policy yet
        self.announced = -1
        self.announced_at: dict[int, float] = {}
        self.step = 0
        self.done = False
        self._poll_cache: dict[int, tuple[float, int, api.AssignmentResponse]] = {}
        self.pool_epoch = 0  # bumped by every act that may change what the pool issues

    # -- set-up and churn ------------------------------------------------------------

    def start(self) -> None:
        d = self.driver
        d.register(d.trainer, "trainer", "http://origin.sim:8800")
        d.register(d.validator, "validator")
        for _ in range(self.p.workers):
            self.join(first=True)
        self.publish(0)
        for r in self.relays:
            self.q.after(self.rng.uniform(0, self.p.relay_poll), self.relay_poll, r)
        self.q.after(self.p.heartbeat_seconds / HOLDING_BEATS, self.heartbeat_round, 1)
        self.q.after(self.p.sweep_seconds, self.sweep)
        self.q.after(self.p.trainer_poll, self.trainer_poll, self.clock.now, [], {})
        for v in range(self.p.validators):
            self.q.after(self.rng.uniform(0, 1.0), self.validate, v)
        for rate, what in (
            (self.p.joins_per_hour, self.churn_join),
            (self.p.leaves_per_hour, self.churn_leave),
            (self.p.deaths_per_hour, self.churn_death),
        ):
            if rate > 0:
                self.q.after(self._gap(rate), what)

    def _gap(self, per_hour: float) -> float:
        return float(self.rng.exponential(3600.0 / (per_hour * self.p.workers)))

    def join(self, first: bool = False) -> None:
        p, i = self.p, len(self.workers)
        w = Worker(
            index=i,
            address=address_of(p.seed, f"worker-{i}"),
            speed=float(self.rng.lognormal(0.0, p.speed_sigma)),
            down=float(p.worker_down_mbit * MBIT * self.rng.lognormal(0.0, p.link_sigma)),
            up=float(p.worker_up_mbit * MBIT * self.rng.lognormal(0.0, p.link_sigma)),
            cheater=bool(self.rng.random() < p.cheater_share),
        )
        self.workers.append(w)
        self.driver.register(w.address)
        self.q.after(self.rng.uniform(0, 1.0) if first else 0.0, self.wake, w, w.life)

    def _alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive and not w.leaving]

    def churn_join(self) -> None:
        self.join()
        self.q.after(self._gap(self.p.joins_per_hour), self.churn_join)

    def churn_leave(self) -> None:
        alive = self._alive()
        if alive:
            alive[int(self.rng.integers(len(alive)))].leaving = True  # after its file in flight
        self.q.after(self._gap(self.p.leaves_per_hour), self.churn_leave)

    def churn_death(self) -> None:
        alive = self._alive()
        if alive:
            self.kill(alive[int(self.rng.integers(len(alive)))])
        self.q.after(self._gap(self.p.deaths_per_hour), self.churn_death)

    def kill(self, w: Worker) -> None:
        w.alive = False
        w.life += 1
        w.holding = 0

    # -- heartbeats and the sweep ----------------------------------------------------

    def heartbeat_round(self, tick: int = 0) -> None:
        """Every member beats once per interval; a worker holding work also halfway
        between (`protocol.membership.HOLDING_BEATS`), as the orchestrator expects."""
        live = [w for w in self.workers if w.alive]
        every = tick % HOLDING_BEATS == 0
        beats: dict[str, int | None] = (
            {self.driver.trainer: None, self.driver.validator: None} if every else {}
        )
        beats |= {
            w.address: w.policy if w.policy >= 0 else None for w in live if every or w.holding
        }
        late = self.driver.heartbeat_round(beats)
        if every:
            self.driver.count("heartbeat", len(self.relays))  # relays: counted, not members here
        by_address = {w.address: w for w in live}
        for address in late:
            try:
                self.driver.heartbeat(address, None)
            except Refusal as exc:
                if exc.code == "dead":  # Membership registers again
                    self.driver.register(address)
                else:
                    self.kill(by_address[address])  # ejected: the worker stops
        self.q.after(self.p.heartbeat_seconds / HOLDING_BEATS, self.heartbeat_round, tick + 1)

    def sweep(self) -> None:
        self.driver.pool.sweep()
        self.pool_epoch += 1
        self.q.after(self.p.sweep_seconds, self.sweep)

    # -- checkpoints down the tree ---------------------------------------------------

    def publish(self, step: int) -> None:
        self.origin_held.add(step)
        self.driver.announce(step)
        self.announced = step
        self.announced_at[step] = self.clock.now
        self.pool_epoch += 1

    def version_bytes(self, step: int) -> float:
        """What a relay mirrors of a version: the full shards, and the delta if any."""
        p = self.p
        delta = p.checkpoint_bytes * p.delta_ratio if p.delta_ratio and step > 0 else 0.0
        return p.checkpoint_bytes + delta

    def relay_poll(self, r: Relay) -> None:
        upstream = self.origin_held if r.parent < 0 else self.relays[r.parent].held
        wanted = [v for v in upstream if v not in r.held]
        if wanted and not r.mirroring:
            v = max(wanted)
            r.mirroring = True
            r.upstream.send(self.version_bytes(v), r.down, lambda: self.mirrored(r, v))
        self.q.after(self.p.relay_poll, self.relay_poll, r)

    def mirrored(self, r: Relay, v: int) -> None:
        r.held.add(v)
        r.mirroring = False
        self.holders.setdefault(v, []).append(r)
        # A worker without a policy polls for the version every `worker_poll`; it is
        # woken at its next poll instead of polling in the simulation.
        for w in self.waiting.pop(v, []):
            self.q.after(self.rng.uniform(0, self.p.worker_poll), self.wake, w, w.life)

    # -- workers ---------------------------------------------------------------------

    def wake(self, w: Worker, life: int) -> None:
        if not w.alive or life != w.life or self.done:
            return
        if w.leaving:
            self.q.at(max(self.clock.now, w.finisher_free), self.kill, w)
            return
        self.driver.count("heartbeat")  # the beat before each request (`member.beat()`)
        newest = self.announced
        if newest > w.policy and self.clock.now >= w.retry_fetch:
            listing: list[Relay | None] = (
                list(self.holders.get(newest, [])) if self.relays else [None]
            )
            if listing and not w.fetching:
                self.fetch(w, newest, listing[int(self.rng.integers(len(listing)))])
                if not self.p.background_fetch or w.policy < 0:
                    w.blocked = True  # `loaded` wakes it
                    return
            elif not listing:
                w.retry_fetch = self.clock.now + self.p.worker_poll  # not listed yet
        if w.policy < 0:
            self.waiting.setdefault(newest, []).append(w)
            return
        answer = self.ask(w)
        if answer is None:
            return
        work = answer.assignment
        if work is None:
            self.q.after(answer.retry_seconds or self.p.worker_poll, self.wake, w, w.life)
            return
        w.holding += 1
        gen = self.p.file_seconds * w.speed * float(self.rng.lognormal(0.0, self.p.file_sigma))
        self.q.after(gen, self.generated, w, w.life, work, w.policy)

    def ask(self, w: Worker) -> api.AssignmentResponse | None:
        """The Pool's answer; an idle worker's poll within `coalesce_seconds` of an
        identical one (same policy, nothing held, no pool act between) gets that one's
        answer, counted but not executed."""
        idle = w.finisher_free <= self.clock.now
        cached = self._poll_cache.get(w.policy) if idle else None
        if (
            cached is not None
            and cached[1] == self.pool_epoch
            and self.clock.now - cached[0] < self.p.coalesce_seconds
        ):
            self.driver.count("assignment")
            return cached[2]
        try:
            answer = self.driver.request(w.address, w.policy)
        except Refusal as exc:
            if exc.code == "dead":
                self.driver.register(w.address)
                self.q.after(self.p.worker_poll, self.wake, w, w.life)
            else:
                self.kill(w)  # ejected
            return None
        if answer.assignment is None and idle and self.p.coalesce_seconds > 0:
            self._poll_cache[w.policy] = (self.clock.now, self.pool_epoch, answer)
        elif answer.assignment is not None:
            self.pool_epoch += 1
        return answer

    def fetch(self, w: Worker, step: int, relay: Relay | None) -> None:
        p, start = self.p, self.clock.now
        delta = bool(p.delta_ratio) and w.policy == step - 1
        nbytes = p.checkpoint_bytes * (p.delta_ratio if delta else 1.0)  # type: ignore[operator]
        rebuild = p.checkpoint_bytes / p.delta_decode_bytes_per_s if delta else 0.0
        server = relay.uplink if relay is not None else self.origin
        w.fetching = True
        life = w.life

        def fetched() -> None:
            self.fig.fetch_seconds.append(self.clock.now - start)
            self.q.after(rebuild + p.load_seconds, self.loaded, w, life, step)

        server.send(nbytes, w.down, fetched)

    def loaded(self, w: Worker, life: int, step: int) -> None:
        w.fetching = False
        if life != w.life:
            return
        w.policy = max(w.policy, step)
        if step >= self.p.warmup_steps:
            self.fig.loaded_after.append(self.clock.now - self.announced_at[step])
        if w.blocked:
            w.blocked = False
            self.wake(w, life)
        # else: a background fetch; the loop generating meanwhile takes it at its next wake

    def generated(self, w: Worker, life: int, work: api.AssignmentInfo, policy: int) -> None:
        if life != w.life:
            return
        # The finisher holds one file: the loop waits for the one before to be delivered.
        begin = max(self.clock.now, w.finisher_free)
        upload_s = self.p.finish_seconds + self.p.transfer_overhead + self.p.file_bytes / w.up
        w.finisher_free = begin + upload_s
        self.q.at(w.finisher_free, self.upload, w, life, work, policy)
        self.q.at(begin, self.wake, w, life)

    def upload(self, w: Worker, life: int, work: api.AssignmentInfo, policy: int) -> None:
        if life != w.life or self.done:
            return
        w.holding -= 1
        groups = work.prompts
        signal = int(self.rng.binomial(groups, self.p.group_yield))
        try:
            info = self.driver.upload(w.address, work, policy, signal)
        except Refusal:
            self.fig.refused += 1
            return
        self.pool_epoch += 1
        self.fig.uploads += 1
        self.files[info.file_hash] = FileRecord(
            w.index, work.step, policy, signal * work.group_size, info.num_samples, w.cheater
        )

    # -- the trainer -----------------------------------------------------------------

    def trainer_poll(self, since: float, order: list[str], read: dict[str, int]) -> None:
        """One poll of step `self.step` (`PoolStepCollector.poll`), then train if enough."""
        if self.done:
            return
        p, n = self.p, self.step
        listed = self.driver.submissions(n)
        new = [s.file_hash for s in listed if s.file_hash not in read]
        for h in new:
            rec = self.files[h]
            read[h] = rec.usable if rec.policy >= n - p.async_level else 0
            order.append(h)
        read_s = len(new) * p.read_seconds_per_file
        usable = sum(read.values())
        samples = sum(self.files[h].samples for h in order)
        enough = usable >= p.batch_samples or (
            p.max_read_ratio > 0 and samples >= p.max_read_ratio * p.batch_samples
        )
        if new:
            self.driver.report(n, usable, samples, order, usable >= p.batch_samples)
            self.pool_epoch += 1
        if not enough:
            self.q.after(read_s + p.trainer_poll, self.trainer_poll, since, order, read)
            return
        live = {s.file_hash for s in self.driver.submissions(n)}  # drop_withdrawn
        kept = [h for h in order if h in live]
        if len(kept) < len(order):
            dropped = {h: read[h] for h in kept}
            self.q.after(read_s + p.trainer_poll, self.trainer_poll, since, kept, dropped)
            return
        used, taken = [], 0
        for h in kept:
            if taken >= p.batch_samples:
                break
            if read[h] > 0:
                used.append(h)
                taken += min(read[h], p.batch_samples - taken)
        self.q.after(read_s, self.train, since, used, {h: read[h] for h in used})

    def train(self, since: float, used: list[str], usable: dict[str, int]) -> None:
        p, n = self.p, self.step
        if used:
            self.driver.mark_trained(n, used)
        wait = self.clock.now - since
        measured = n >= p.warmup_steps
        taken = 0
        for h in used:
            rec = self.files[h]
            k = min(usable[h], p.batch_samples - taken)
            taken += k
            if measured:
                self.fig.staleness[n - rec.policy] = self.fig.staleness.get(n - rec.policy, 0) + k
            if rec.cheater:
                c = self.fig.cheater_samples_trained
                c[rec.worker] = c.get(rec.worker, 0) + k
        self.fig.samples_trained += taken
        if measured:
            self.fig.wait_seconds.append(wait)
            self.fig.step_seconds.append(wait + p.train_seconds)
        encode = p.checkpoint_bytes / p.delta_encode_bytes_per_s if p.delta_ratio else 0.0
        self.q.after(p.train_seconds + p.save_seconds + encode, self.stepped, n)

    def stepped(self, n: int) -> None:
        if n >= self.p.warmup_steps:
            self.fig.cycle_seconds.append(self.clock.now - self.announced_at[n])
        self.step = n + 1
        if self.step == self.p.warmup_steps:
            self.fig.measured_from = self.clock.now
        self.publish(self.step)
        if self.step >= self.p.warmup_steps + self.p.steps:
            self.done = True
            self.fig.measured_to = self.clock.now
            return
        self.q.after(self.p.trainer_poll, self.trainer_poll, self.clock.now, [], {})

    # -- the validator ---------------------------------------------------------------

    def validate(self, v: int) -> None:
        if self.done:
            return
        task = self.driver.next_to_validate()
        if task.submission is None:
            self.q.after(self.p.validator_poll, self.validate, v)
            return
        self.q.after(self.p.validate_seconds, self.verdict, v, task.submission.file_hash)

    def verdict(self, v: int, file_hash: str) -> None:
        rec = self.files[file_hash]
        caught = rec.cheater and self.rng.random() < self.p.detect_probability
        try:
            self.driver.verdict(file_hash, accepted=not caught)
        except Refusal:
            pass  # judged meanwhile (a lease that ran out), or no longer pending
        else:
            self.pool_epoch += 1
            if caught:
                self.fig.cheaters_caught.setdefault(rec.worker, self.clock.now)
        self.validate(v)

    # -- running ---------------------------------------------------------------------

    def run(self) -> Figures:
        self.start()
        self.q.run(self.clock.start + self.p.max_seconds, stop=lambda: self.done)
        if not self.done:
            self.fig.measured_to = self.clock.now
        self.fig.samples_accepted = self.driver.live_samples()
        return self.fig


def quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else math.nan
