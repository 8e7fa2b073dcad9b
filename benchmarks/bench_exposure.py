"""Exposure: how many samples a cheater gets trained before it is caught.

    python benchmarks/bench_exposure.py                  # the table in docs/orchestrator.md
    python benchmarks/bench_exposure.py --cheaters 50 --fractions 0.1,0.5 --leads 0,2

The pool's rules (docs/orchestrator.md, "Exposure"): each file is chosen for validation
by HMAC(secret, file hash) with probability f (a member's first `new_member_files` files
with `new_member_validation_fraction`); a chosen file is trained only once accepted; a
reject voids every file of the worker not trained yet and ejects it. A cheater therefore
gets trained exactly its files that were not chosen and were trained before the verdict
on its first chosen cheating file. The trainer's lead L is how many steps it trains
between a file's upload and that file's verdict: L = 0 when the validator keeps up (the
verdict lands before the step the file was uploaded for is trained).

**Formula.** The cheater uploads k files per step; file n (1-based) lies in step
floor((n − 1) / k) and is chosen with probability p_n. It cheats from file c on (files
before c are honest: accepted when chosen, trained, no exposure). Let N be its first
chosen file from c on: P(N = n) = p_n · prod_{c <= m < n} (1 − p_m). The verdict on N
lands before step s_N + L is trained (s_N = floor((N − 1) / k)), so exactly the files
n <= k (s_N + L) are trained, N and the chosen ones excepted:

    E[files] = sum_N P(N) · [ max(0, min(N − 1, k (s_N + L)) − c + 1)
                              + sum_{N < n <= k (s_N + L)} (1 − p_n) ]

With a constant rate f (q = 1 − f), c = 1: E = k q^k / (1 − q^k) for L = 0, and for
L >= 1 add E[j] + q (k L − 1 − E[j]), where E[j] = q / f − k q^k / (1 − q^k) is the
expected number of files before N in its own step. For k = 1: q/f + q·max(0, L − 1).
Samples = files × samples per file.

**Simulation.** The real `swarmrl.orchestrator.pool.Pool` (SQLite ledger, local store,
in process, no HTTP), driven step by step: the trainer announces checkpoint s; every
cheater (a fresh member each, `--cheaters` of them at once, independent) takes k
assignments and uploads a real rollout file for each (`Pool.accept_upload`: the strict
reader, the ledger, the store; the pool makes the validation choice); the validator
posts verdicts, in upload order, on the chosen pending files uploaded L or more steps
ago (reject for a cheating file, accept for an honest one); the trainer then marks
trained every file of step s the pool lists as trainable. Exposure is read back from
the ledger: each cheater's cheating files with a trained step. Where the Pool does not
enforce a rule yet (no new-member rate, chosen files listed before their verdict, no
voiding or ejection on a reject), the driver applies it and the report says which.

Variants: `flat` (rate f for every file), `new member` (the first `new_member_files`
files at `new_member_validation_fraction`, cheating from the first file), `patient`
(the same rate, but honest for those files and cheating after them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sqlalchemy import select, update

from swarmrl.identity import Identity
from swarmrl.ledger import Ledger, Member, Submission, check_ledger
from swarmrl.orchestrator.auth import Caller
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.errors import Refusal
from swarmrl.orchestrator.issuance import chosen_for_validation
from swarmrl.orchestrator.pool import Pool
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.orchestrator.uploads import UploadedFile
from swarmrl.protocol import models as api
from swarmrl.rollouts import RolloutMeta, write_rollouts

RUN_ID = "exposure"
VARIANTS = ("flat", "new member", "patient")


@dataclass(frozen=True)
class Scenario:
    fraction: float  # f
    lead: int  # L, in steps
    files_per_step: int  # k
    variant: str
    new_member_files: int  # M
    new_member_fraction: float  # f0

    @property
    def first_cheating_file(self) -> int:  # c, 1-based
        return self.new_member_files + 1 if self.variant == "patient" else 1

    def rate(self, n: int) -> float:
        """p_n: the chance that the member's n-th file (1-based) is chosen."""
        if self.variant != "flat" and n <= self.new_member_files:
            return max(self.fraction, self.new_member_fraction)
        return self.fraction


# --- the formula ---------------------------------------------------------------------------


def expected_files(sc: Scenario, tail: float = 1e-12) -> float:
    """E[cheating files trained] by the sum in the module docstring."""
    k, lead, c = sc.files_per_step, sc.lead, sc.first_cheating_file
    if sc.fraction <= 0:
        return math.inf
    total, unchosen_before, n = 0.0, 1.0, c  # unchosen_before = P(no chosen file in [c, n))
    while unchosen_before > tail:
        p_n = sc.rate(n)
        step = (n - 1) // k
        window = k * (step + lead)  # files n' <= window are trained
        before = max(0, min(n - 1, window) - c + 1)
        after = sum(1.0 - sc.rate(m) for m in range(n + 1, window + 1))
        total += unchosen_before * p_n * (before + after)
        unchosen_before *= 1.0 - p_n
        n += 1
    return total


def closed_form_flat(f: float, k: int, lead: int) -> float:
    """The constant-rate closed form (module docstring); equals `expected_files` for `flat`."""
    q = 1.0 - f
    whole_steps = k * q**k / (1.0 - q**k)
    if lead == 0:
        return whole_steps
    in_step = q / f - whole_steps
    return whole_steps + in_step + q * (k * lead - 1 - in_step)


# --- the simulation ------------------------------------------------------------------------


@dataclass
class Cheater:
    address: str
    files: int = 0  # uploaded so far
    cheating: list[str] = field(default_factory=list)  # hashes of its cheating files
    honest: set[str] = field(default_factory=set)
    caught_at: int | None = None  # step of the verdict that caught it


def caller(address: str) -> Caller:
    """The Pool driven in-process: each act as if signed by `address`, with a fresh nonce."""
    return Caller(
        address=address,
        nonce=secrets.token_hex(16),
        timestamp=int(time.time()),
        signed_text="",
        signature="",
    )


def rollout_file(path: Path, worker: str, a: api.AssignmentInfo) -> Path:
    n = a.prompts * a.group_size
    columns = {
        "problem_id": [f"p{i // a.group_size}" for i in range(n)],
        "input_tokens": [[1, 2, 3]] * n,
        "output_tokens": [[4, 5, 6, 7]] * n,
        "output_logprobs": [[-0.5] * 4] * n,
        "rewards": [float(i % 2) for i in range(n)],
        "task_rewards": [float(i % 2) for i in range(n)],
        "length_penalties": [0.0] * n,
        "advantages": [1.0 if i % 2 else -1.0 for i in range(n)],
        "target_lengths": [-1] * n,
        "policy_step": [a.step] * n,
        "seed": list(range(n)),
        "proofs": [b"\x00" * 258] * n,
    }
    meta = RolloutMeta(
        run_id=RUN_ID,
        worker_address=worker,
        step=a.step,
        submission=a.id,
        num_samples=n,
        num_nonzero=n,
    )
    return write_rollouts(path, columns, meta)


class Simulation:
    def __init__(self, sc: Scenario, cheaters: int, root: Path, seed: int) -> None:
        self.sc = sc
        self.root = root
        self.trainer = Identity.generate().address
        self.validator = Identity.generate().address
        settings = {
            "ledger": f"sqlite:///{root / 'ledger.db'}",
            "store": str(root / "store"),
            "secret_file": str(root / "secret"),
            "run_id": RUN_ID,
            "batch_samples": 10**9,  # a step never fills: work never runs out
            "validation_fraction": sc.fraction,
            "max_open_per_worker": sc.files_per_step,
            "async_level": 0,
            "max_ahead": 0,
        }
        self.pool_rate = "new_member_files" in OrchestratorConfig.model_fields
        if self.pool_rate:
            settings["new_member_files"] = 0 if sc.variant == "flat" else sc.new_member_files
            settings["new_member_validation_fraction"] = sc.new_member_fraction
        self.config = OrchestratorConfig(**settings)
        self.secret = hashlib.sha256(f"bench-exposure|{seed}".encode()).digest()
        self.clock = 0.0
        self.pool = Pool(
            self.config,
            Ledger(self.config.ledger),
            RolloutStore(self.config.store),
            self.secret,
            {self.trainer: {"trainer"}, self.validator: {"validator"}},
            clock=lambda: self.clock,
        )
        self.pool.register(caller(self.trainer), api.RegisterRequest(role="trainer"))
        self.pool.register(caller(self.validator), api.RegisterRequest(role="validator"))
        self.cheaters = [Cheater(Identity.generate().address) for _ in range(cheaters)]
        for c in self.cheaters:
            self.pool.register(caller(c.address), api.RegisterRequest(role="worker"))
        self.by_address = {c.address: c for c in self.cheaters}
        # rule -> what was seen: True where the Pool applied it, False where the driver had to
        self.enforced: dict[str, set[bool]] = {}
        if sc.variant != "flat":
            self.enforced["new-member rate"] = {self.pool_rate}
        self.ejected_by_driver: set[str] = set()
        self.uploads = 0

    def _upload(self, c: Cheater, step: int) -> None:
        answer = self.pool.request_assignment(
            caller(c.address), api.AssignmentRequest(policy_step=step)
        )
        a = answer.assignment
        assert a is not None and a.step == step, answer.reason
        path = rollout_file(self.root / "outbox" / f"{a.id}.parquet", c.address, a)
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        self.pool.accept_upload(c.address, a.id, UploadedFile(path, digest, len(data)))
        path.unlink()
        c.files += 1
        self.uploads += 1
        if c.files < self.sc.first_cheating_file:
            c.honest.add(digest)
        else:
            c.cheating.append(digest)
        if self.sc.variant != "flat" and not self.pool_rate and c.files <= self.sc.new_member_files:
            # The driver applies the new-member rate the Pool lacks.
            chosen = chosen_for_validation(self.secret, digest, self.sc.rate(c.files))
            with self.pool.ledger.session() as s:
                s.execute(
                    update(Submission)
                    .where(Submission.file_hash == digest)
                    .values(to_validate=chosen)
                )

    def _judge(self, step: int) -> None:
        """Verdicts, in upload order, on the chosen pending files of steps <= step − lead."""
        with self.pool.ledger.session() as s:
            due = s.execute(
                select(Submission.file_hash, Submission.worker)
                .where(
                    Submission.to_validate.is_(True),
                    Submission.state == "pending",
                    Submission.step <= step - self.sc.lead,
                )
                .order_by(Submission.uploaded_at, Submission.file_hash)
            ).all()
        for file_hash, worker in due:
            c = self.by_address[worker]
            if c.caught_at is not None:
                continue  # voided by the reject that caught it (by the Pool or the driver)
            accepted = file_hash in c.honest
            try:
                self.pool.record_verdict(
                    caller(self.validator),
                    api.VerdictRequest(
                        file_hash=file_hash,
                        accepted=accepted,
                        reason="" if accepted else "rejected: sampling: simulated cheat",
                    ),
                    body="",
                )
            except Refusal as exc:
                if exc.status != 409:  # voided meanwhile by the Pool
                    raise
                continue
            if accepted:
                continue
            c.caught_at = step
            with self.pool.ledger.session() as s:
                member = s.get_one(Member, worker)
                ejected = getattr(member, "ejected_at", None) is not None
                left = s.scalar(
                    select(Submission.file_hash).where(
                        Submission.worker == worker,
                        Submission.state == "pending",
                        Submission.trained_step.is_(None),
                    )
                )
            voids = ejected and left is None
            self.enforced.setdefault("voiding and ejection", set()).add(voids)
            if not voids:
                self.ejected_by_driver.add(worker)

    def _train(self, step: int) -> None:
        listed = self.pool.submissions_for_step(caller(self.trainer), step).submissions
        with self.pool.ledger.session() as s:
            chosen = dict(
                s.execute(
                    select(Submission.file_hash, Submission.state).where(
                        Submission.step == step, Submission.to_validate.is_(True)
                    )
                ).all()
            )
        if "pending" in chosen.values():
            held = not any(chosen.get(x.file_hash) == "pending" for x in listed)
            self.enforced.setdefault("train only once accepted", set()).add(held)
        trainable = [
            x.file_hash
            for x in listed
            if (x.state == "accepted" or x.file_hash not in chosen)
            and x.worker not in self.ejected_by_driver
        ]
        if trainable:
            self.pool.mark_trained(
                caller(self.trainer), api.MarkTrainedRequest(step=step, file_hashes=trainable)
            )

    def run(self, max_steps: int) -> dict:
        blake3 = "0" * 64
        for step in range(max_steps):
            self.clock = float(step)
            self.pool.announce_checkpoint(
                caller(self.trainer), api.CheckpointAnnouncement(step=step, blake3=blake3)
            )
            for c in self.cheaters:
                if c.caught_at is None:
                    for _ in range(self.sc.files_per_step):
                        self._upload(c, step)
            self._judge(step)
            self._train(step)
            if all(c.caught_at is not None for c in self.cheaters):
                break
        with self.pool.ledger.session() as s:
            trained = set(
                s.scalars(select(Submission.file_hash).where(Submission.trained_step.is_not(None)))
            )
            problems = check_ledger(s)
        exposure = [sum(h in trained for h in c.cheating) for c in self.cheaters]
        return {
            "rule_mismatches": sum(
                e != self._implied_exposure(c) for e, c in zip(exposure, self.cheaters, strict=True)
            ),
            "exposure_files": exposure,
            "trained_files": [
                e + sum(h in trained for h in c.honest)
                for e, c in zip(exposure, self.cheaters, strict=True)
            ],
            "uncaught": sum(c.caught_at is None for c in self.cheaters),
            "ledger_problems": problems,
            "uploads": self.uploads,
            "tainted_by_pool": self._tainted_by_pool(),
        }

    def _implied_exposure(self, c: Cheater) -> int:
        """What the rules give for this cheater's actual validation choices: its unchosen
        cheating files up to the end of step s_N + L − 1 (module docstring)."""
        with self.pool.ledger.session() as s:
            chosen = dict(
                s.execute(
                    select(Submission.file_hash, Submission.to_validate).where(
                        Submission.file_hash.in_(c.cheating)
                    )
                ).all()
            )
        flags = [chosen[h] for h in c.cheating]  # in upload order
        if True not in flags:
            return -1  # never caught: no exposure is implied
        first = len(c.honest) + flags.index(True)  # 0-based index among all its files
        window = self.sc.files_per_step * (first // self.sc.files_per_step + self.sc.lead)
        return sum(not flag for i, flag in enumerate(flags, start=len(c.honest)) if i < window)

    def _tainted_by_pool(self) -> list[int] | None:
        """The Pool's own count of each cheater's trained files, where it keeps one."""
        slashings = getattr(self.pool.status(), "slashings", None)
        if slashings is None:
            return None
        tainted = {x.address: x.tainted_files for x in slashings}
        return [tainted.get(c.address, -1) for c in self.cheaters]


def _scratch() -> str | None:
    """A memory-backed folder where there is one: every upload and ledger commit syncs to
    disk, which would time the disk rather than the rules."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=_floats, default=[0.05, 0.1, 0.25, 0.5])
    parser.add_argument("--leads", type=_ints, default=[0, 1, 2], help="trainer lead, in steps")
    parser.add_argument(
        "--files-per-step", type=int, default=2, help="k: the cheater's files per step"
    )
    parser.add_argument("--samples-per-file", type=int, default=64, help="prompts x group size")
    parser.add_argument("--cheaters", type=int, default=200, help="cheaters per scenario")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--new-member-files", type=int, default=2)
    parser.add_argument("--new-member-fraction", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("swarmrl").setLevel(logging.ERROR)  # one warning per ejection otherwise
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    spf = args.samples_per_file
    rows = []
    enforced: dict[str, set[bool]] = {}
    print(
        f"{'variant':10s} {'f':>5s} {'lead':>4s} | {'formula':>8s} {'mean':>8s} {'±se':>6s}"
        f" {'p90':>6s} {'max':>6s} | samples, k = {args.files_per_step}, {args.cheaters} cheaters"
    )
    for variant in variants:
        for f in args.fractions:
            for lead in args.leads:
                sc = Scenario(
                    f,
                    lead,
                    args.files_per_step,
                    variant,
                    args.new_member_files,
                    args.new_member_fraction,
                )
                # Long enough that a cheater escapes with probability < 1e-9.
                max_steps = (
                    math.ceil(
                        (math.log(1e-9) / math.log(1 - f) + args.new_member_files)
                        / args.files_per_step
                    )
                    + lead
                    + 1
                )
                start = time.perf_counter()
                with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
                    sim = Simulation(sc, args.cheaters, Path(tmp), args.seed)
                    out = sim.run(max_steps)
                    sim.pool.ledger.close()
                files = np.array(out["exposure_files"], dtype=float)
                samples = files * spf
                formula = expected_files(sc) * spf
                if variant == "flat":
                    assert math.isclose(
                        formula, closed_form_flat(f, args.files_per_step, lead) * spf, rel_tol=1e-6
                    )
                row = {
                    "variant": variant,
                    "fraction": f,
                    "lead": lead,
                    "files_per_step": args.files_per_step,
                    "formula_samples": round(formula, 1),
                    "mean_samples": round(float(samples.mean()), 1),
                    "se_samples": round(float(samples.std(ddof=1) / math.sqrt(len(samples))), 1),
                    "p90_samples": float(np.percentile(samples, 90)),
                    "max_samples": float(samples.max()),
                    "zero_share": round(float((files == 0).mean()), 3),
                    "uncaught": out["uncaught"],
                    "rule_mismatches": out["rule_mismatches"],
                    "uploads": out["uploads"],
                    "ledger_problems": len(out["ledger_problems"]),
                    "pool_taint_agrees": None
                    if out["tainted_by_pool"] is None
                    else out["tainted_by_pool"] == out["trained_files"],
                    "seconds": round(time.perf_counter() - start, 1),
                }
                rows.append(row)
                for name, seen in sim.enforced.items():
                    enforced.setdefault(name, set()).update(seen)
                print(
                    f"{variant:10s} {f:5.2f} {lead:4d} | {row['formula_samples']:8.1f}"
                    f" {row['mean_samples']:8.1f} {row['se_samples']:6.1f}"
                    f" {row['p90_samples']:6.0f} {row['max_samples']:6.0f}"
                    f" | uncaught {row['uncaught']}, off the rules {row['rule_mismatches']},"
                    f" ledger problems {row['ledger_problems']},"
                    f" {row['seconds']} s",
                    flush=True,
                )
    rules = {
        name: "pool" if values == {True} else "driver" if values == {False} else "mixed"
        for name, values in enforced.items()
    }
    print("rules applied by:", "; ".join(f"{k}: {v}" for k, v in rules.items()))
    print(json.dumps({"rows": rows, "rules": rules}))


if __name__ == "__main__":
    main()
