"""The real orchestrator `Pool` in process: a real SQLite ledger and rollout store, the
pool's clock the simulation's, each act called below the HTTP layer.

What is bypassed, and why: the signed-request layer (`auth.RequestVerifier`: signature
recovery and the timestamp check against wall time) runs before the `Pool` and is not
called; every act still goes through `Pool.signed_act` with a `Caller`, so its nonce is
spent and checked in the ledger as in production. The rate limiter is off. Uploads are
real Parquet rollout files (schematic content: a few tokens per sample; the sizes the
links carry are modelled in `swarm.py`), checked by the strict reader and recorded by
`Pool.accept_upload`. The heartbeats of healthy members are applied once per heartbeat
interval, all at the interval's time, in one transaction of the statement
`membership.beat` runs for a healthy member (their nonces and signed acts skipped:
10,000 workers send hundreds a second); any other member's heartbeat goes through
`Pool.heartbeat` itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from eth_utils import to_checksum_address
from sqlalchemy import func, select

from swarmrl.ledger import Ledger, Member, Submission
from swarmrl.ledger.models import LIVE_STATES
from swarmrl.orchestrator import membership
from swarmrl.orchestrator.auth import Caller
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.pool import Pool
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.orchestrator.uploads import UploadedFile
from swarmrl.protocol import models as api
from swarmrl.rollouts import RolloutMeta, write_rollouts
from swarmsim.events import SimClock

RUN_ID = "swarmsim"
# Members a heartbeat does more for than record it: back to health, or refused.
_UNWELL = select(Member.address).where(
    (Member.status != "healthy") | Member.ejected_at.is_not(None)
)


def address_of(seed: int, name: str) -> str:
    """A deterministic member address (the Pool checks no signature below HTTP)."""
    return to_checksum_address("0x" + hashlib.sha256(f"{seed}/{name}".encode()).hexdigest()[:40])


def rollout_columns(n: int, group: int, step: int, policy: int, nonzero_groups: int) -> dict:
    """A schema-valid file of n samples; the first `nonzero_groups` groups carry signal."""
    adv = [(1.0 if i % 2 else -1.0) if i // group < nonzero_groups else 0.0 for i in range(n)]
    return {
        "problem_id": [f"p{i // group}" for i in range(n)],
        "input_tokens": [[1, 2, 3]] * n,
        "output_tokens": [[4, 5, 6, 7]] * n,
        "output_logprobs": [[-0.5] * 4] * n,
        "rewards": [max(a, 0.0) for a in adv],
        "task_rewards": [max(a, 0.0) for a in adv],
        "length_penalties": [0.0] * n,
        "advantages": adv,
        "target_lengths": [-1] * n,
        "policy_step": [policy] * n,
        "seed": [step * 1_000_003 + i for i in range(n)],
        "proofs": [b"\x00" * 258] * n,
    }


class PoolDriver:
    """One `Pool` and the acts the simulated members send it, each counted by kind."""

    def __init__(self, config: dict, root: Path, clock: SimClock, seed: int) -> None:
        self.root = root
        self.clock = clock
        self.seed = seed
        self.trainer = address_of(seed, "trainer")
        self.validator = address_of(seed, "validator")
        settings = {
            "ledger": f"sqlite:///{root / 'ledger.db'}",
            "store": str(root / "store"),
            "secret_file": str(root / "secret"),
            "run_id": RUN_ID,
        } | config
        self.config = OrchestratorConfig(**settings)
        self.ledger = Ledger(self.config.ledger)
        secret = hashlib.sha256(f"swarmsim secret {seed}".encode()).digest()
        allow = {self.trainer: {"trainer"}, self.validator: {"validator"}}
        self.pool = Pool(
            self.config, self.ledger, RolloutStore(self.config.store), secret, allow, clock=clock
        )
        self.requests: dict[str, int] = {}
        self._nonce = 0
        self._files = root / "outbox"
        self._files.mkdir(parents=True, exist_ok=True)

    def count(self, kind: str, n: int = 1) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + n

    def caller(self, address: str) -> Caller:
        self._nonce += 1
        return Caller(
            address=address,
            nonce=f"{self._nonce:032x}",
            timestamp=int(self.clock()),
            signed_text="",
            signature="",
        )

    # -- members ---------------------------------------------------------------------

    def register(self, address: str, role: str = "worker", url: str | None = None) -> None:
        self.count("register")
        self.pool.register(self.caller(address), api.RegisterRequest(role=role, url=url))  # type: ignore[arg-type]

    def heartbeat(self, address: str, policy: int | None) -> api.HeartbeatResponse:
        self.count("heartbeat")
        return self.pool.heartbeat(self.caller(address), api.HeartbeatRequest(policy_step=policy))

    def heartbeat_round(self, beats: dict[str, int | None]) -> list[str]:
        """Every live member's heartbeat of one interval, in one transaction: for a healthy
        member the statement `membership.beat` runs for it (`membership._BEAT`), sent as
        one batch; the members that are not healthy are returned, and the caller sends
        theirs through `Pool.heartbeat` (back to health, or the answer `dead`/`ejected`)."""
        self.count("heartbeat", len(beats))
        now = self.clock()
        with self.pool._lock, self.ledger.session() as s:
            c = s.connection()
            unwell = set(c.execute(_UNWELL).scalars())
            late = [a for a in beats if a in unwell]
            rows = [
                {"who": a, "now": now, "held": policy, "served": None}
                for a, policy in beats.items()
                if a not in unwell
            ]
            if rows:
                c.execute(membership._BEAT, rows)
        return late

    # -- workers ---------------------------------------------------------------------

    def request(self, address: str, policy: int) -> api.AssignmentResponse:
        self.count("assignment")
        return self.pool.request_assignment(
            self.caller(address), api.AssignmentRequest(policy_step=policy)
        )

    def upload(
        self, address: str, work: api.AssignmentInfo, policy: int, nonzero_groups: int
    ) -> api.SubmissionInfo:
        """A real rollout file for the assignment, through both signed acts of an upload."""
        self.count("upload")
        self.pool.check_upload_target(self.caller(address), work.id)
        n = work.prompts * work.group_size
        meta = RolloutMeta(
            run_id=RUN_ID,
            worker_address=address,
            step=work.step,
            submission=work.id,
            num_samples=n,
            num_nonzero=nonzero_groups * work.group_size,
        )
        path = write_rollouts(
            self._files / f"{work.id}.parquet",
            rollout_columns(n, work.group_size, work.step, policy, nonzero_groups),
            meta,
        )
        data = path.read_bytes()
        upload = UploadedFile(path, hashlib.sha256(data).hexdigest(), len(data))
        try:
            return self.pool.accept_upload(address, work.id, upload)
        finally:
            path.unlink(missing_ok=True)

    # -- the trainer and the validator -----------------------------------------------

    def submissions(self, step: int) -> list[api.SubmissionInfo]:
        self.count("trainer")
        return self.pool.submissions_for_step(self.caller(self.trainer), step).submissions

    def report(self, step: int, usable: int, read: int, files: list[str], full: bool) -> None:
        self.count("trainer")
        self.pool.report_progress(
            self.caller(self.trainer),
            step,
            api.ProgressReport(usable=usable, read=read, files=files[-10_000:], full=full),
        )

    def mark_trained(self, step: int, files: list[str]) -> None:
        self.count("trainer")
        self.pool.mark_trained(
            self.caller(self.trainer), api.MarkTrainedRequest(step=step, file_hashes=files)
        )

    def announce(self, step: int, final: bool = False) -> None:
        self.count("trainer")
        digest = hashlib.sha256(f"checkpoint {step}".encode()).hexdigest()
        self.pool.announce_checkpoint(
            self.caller(self.trainer),
            api.CheckpointAnnouncement(step=step, blake3=digest, final=final),
        )

    def next_to_validate(self) -> api.ValidationTask:
        self.count("validator")
        return self.pool.next_for_validation(self.caller(self.validator))

    def verdict(self, file_hash: str, accepted: bool) -> str:
        self.count("validator")
        req = api.VerdictRequest(
            file_hash=file_hash, accepted=accepted, reason="" if accepted else "toploc"
        )
        return self.pool.record_verdict(
            self.caller(self.validator), req, body=req.model_dump_json()
        ).state

    def live_samples(self) -> int:
        """Samples of the files the ledger holds live (pending or accepted)."""
        with self.ledger.session() as s:
            total = s.scalar(
                select(func.coalesce(func.sum(Submission.num_samples), 0)).where(
                    Submission.state.in_(LIVE_STATES)
                )
            )
        return int(total or 0)

    def close(self) -> None:
        self.ledger.close()
