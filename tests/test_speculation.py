"""One silent worker does not stall the pool: a real orchestrator process and two worker
processes, one stopped with SIGSTOP (its link cut, as far as the pool can tell) while it
holds an assignment. The idle worker gets the stalled share within a heartbeat; the
stopped worker's late upload is refused before its body is read, without penalty;
nothing is credited twice."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from pool_fixtures import orchestrator_process, pool_id
from swarmrl.identity import Identity, generate_key_file, load_identity, sign_request
from swarmrl.ledger import Assignment, Ledger, Member, Submission, check_ledger
from swarmrl.ledger.models import SHARE, share_of
from swarmrl.orchestrator.speculation import silence_allowed, won
from swarmrl.protocol import PoolClient
from swarmrl.protocol.models import SUBMISSION_STATES

HEARTBEAT = 1.0
GEN = 0.5
HERE = Path(__file__).parent


def orchestrator(tmp_path: Path, allowlist: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    return orchestrator_process(
        tmp_path,
        "--allowlist",
        str(allowlist),
        "--run-id",
        "test",
        "--steps",
        "1",
        "--batch-samples",
        "8",
        "--prompts-per-assignment",
        "2",
        "--group-size",
        "2",
        "--prior-yield",
        "1",
        "--surplus",
        "0",
        "--max-open-per-worker",
        "1",
        "--validation-fraction",
        "0",
        "--heartbeat-seconds",
        str(HEARTBEAT),
        "--sweep-seconds",
        "0.2",
        # The test's trainer never heartbeats; on a loaded machine a test may take long.
        "--unhealthy-after",
        "300",
        "--dead-after",
        "600",
        *extra,
    )


class SimWorker:
    """A `sim_worker.py` process and the lines it printed, with when they came."""

    def __init__(self, url: str, tmp_path: Path, name: str, gen: float = GEN) -> None:
        self.key = tmp_path / f"{name}.key"
        self.address = generate_key_file(self.key).address
        workdir = tmp_path / name
        workdir.mkdir()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "sim_worker.py"),
                url,
                str(self.key),
                str(workdir),
                str(gen),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.strip()))

    def wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} within {timeout} s") from None
            if line.startswith(prefix):
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(timeout=30)


def headers_only_upload(
    url: str, identity: Identity, assignment_id: int, declared: int
) -> tuple[int, dict]:
    """Start a signed rollout upload that declares `declared` bytes and send none of them:
    the status and JSON body of the answer. A server that reads the body before it
    refuses never answers (the socket times out)."""
    sha256 = hashlib.sha256(bytes(declared)).hexdigest()
    path = f"/v1/assignments/{assignment_id}/rollout?sha256={sha256}"
    signed = sign_request(identity, "PUT", path, sha256, pool=pool_id(url))
    where = urlsplit(url)
    assert where.scheme == "http" and where.hostname and where.port
    head = [
        f"PUT {path} HTTP/1.1",
        f"Host: {where.netloc}",
        "Content-Type: application/octet-stream",
        f"Content-Length: {declared}",
        *(f"{k}: {v}" for k, v in signed.items()),
    ]
    with socket.create_connection((where.hostname, where.port), timeout=20) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536) or b"?" * 4  # closed: fail on the status below
        top, _, body = answer.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        while len(body) < length:
            more = sock.recv(65536)
            assert more, "the connection closed mid-answer"
            body += more
    return int(lines[0].split()[1]), json.loads(body)


def step_full_within(url: str, timeout: float) -> float | None:
    """Seconds until step 0 is full, or None if it is not within `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        steps = httpx.get(f"{url}/v1/status").json()["steps"]
        if steps and steps[-1]["full"]:
            return time.monotonic() - start
        time.sleep(0.05)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("speculate", [True, False], ids=["speculate", "no-speculate"])
def test_a_stopped_worker_does_not_stall_its_step(tmp_path, speculate):
    trainer = Identity.generate()
    allowlist = tmp_path / "allowlist"
    allowlist.write_text(f"{trainer.address} trainer\n")
    proc, url = orchestrator(tmp_path, allowlist, "--speculate" if speculate else "--no-speculate")
    workers: list[SimWorker] = []
    try:
        with PoolClient(url, trainer) as t:
            t.register("trainer")
            t.announce_checkpoint(0, "a" * 64)
            workers = [SimWorker(url, tmp_path, f"w{i}") for i in range(2)]
            # Whoever takes work first is cut off while it "generates".
            stalled = None
            while stalled is None:
                for w in workers:
                    if not w.lines.empty():
                        stalled = w
                        break
                time.sleep(0.01)
            holding = stalled.wait_for("holding", 30).split()
            assert holding[2] == "0"
            stalled.proc.send_signal(signal.SIGSTOP)
            if not speculate:
                # Nothing moves while it is stopped: its assignment is out for 600 s.
                assert step_full_within(url, timeout=HEARTBEAT * 1.25 + GEN + 3) is None
                stalled.proc.send_signal(signal.SIGCONT)
                assert stalled.wait_for("uploaded", 30).endswith("pending")
                return
            # The idle worker takes the silent one's share and fills the step while the
            # silent one is still stopped (bounded generously: a loaded machine is slow).
            assert step_full_within(url, timeout=30) is not None, "the step waited"
            silent_since = next(
                m["last_heartbeat"]
                for m in httpx.get(f"{url}/v1/status").json()["members"]
                if m["address"] == stalled.address
            )
            # Its share is settled: an upload for it is refused from the ledger alone,
            # before the body (10 MB declared, none sent) is read.
            status_code, problem = headers_only_upload(
                url, load_identity(stalled.key), int(holding[1]), 10_000_000
            )
            assert (status_code, problem["code"]) == (409, "conflict"), problem
            assert "came in first" in problem["detail"]
            stalled.proc.send_signal(signal.SIGCONT)
            # Its own upload is refused the same way, without penalty.
            assert stalled.wait_for("refused", 30) == f"refused {holding[1]} 409"
            listed = t.submissions_for_step(0).submissions
            assert len(listed) == 2 and stalled.address not in {x.worker for x in listed}
            t.mark_trained(0, [x.file_hash for x in listed])
            t.announce_checkpoint(1, "b" * 64, final=True)
            for w in workers:
                assert w.proc.wait(timeout=30) == 0
            status = httpx.get(f"{url}/v1/status").json()
    finally:
        for w in workers:
            w.stop()
        proc.terminate()
        proc.wait(timeout=30)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.session() as s:
            assert check_ledger(s) == []
            twin = s.query(Assignment).filter(Assignment.covers.is_not(None)).one()
            # Issued once the holder had been silent for about a heartbeat (and the slack
            # for a late beat), not at its deadline; the rest is a busy machine's scheduling.
            assert 0 < twin.issued_at - silent_since < silence_allowed(HEARTBEAT) + 5
            member = s.get_one(Member, stalled.address)
            assert (member.lapses, member.soft_invalidated_at) == (0, None)
            states = sorted(x.state for x in s.query(Submission))
            assert states == ["pending", "pending"]
            assert s.get_one(Assignment, int(holding[1])).state == "lapsed"
    finally:
        ledger.close()
    # Paid for the two files trained, 4 samples each, nothing for the refused one.
    paid = {m["address"]: m["paid"] for m in status["members"] if m["role"] == "worker"}
    assert sum(paid.values()) == 8 and paid[stalled.address] == 0


@pytest.mark.slow
def test_a_worker_that_beats_but_never_uploads_is_covered_as_a_straggler(tmp_path):
    """Heartbeats go on, the upload never comes (a worker stuck, or its uploads failing):
    its share goes to the idle worker once it has been out `straggler_factor` (4) times
    the newest returned assignments' median, long before its deadline."""
    trainer = Identity.generate()
    allowlist = tmp_path / "allowlist"
    allowlist.write_text(f"{trainer.address} trainer\n")
    proc, url = orchestrator(tmp_path, allowlist, "--speculate")
    workers: list[SimWorker] = []
    try:
        with PoolClient(url, trainer) as t:
            t.register("trainer")
            t.announce_checkpoint(0, "a" * 64)
            stuck = SimWorker(url, tmp_path, "stuck", gen=600.0)
            workers.append(stuck)
            holding = stuck.wait_for("holding", 30).split()
            workers.append(SimWorker(url, tmp_path, "fast"))
            assert step_full_within(url, timeout=60) is not None, "the step waited"
            beat = next(
                m["last_heartbeat"]
                for m in httpx.get(f"{url}/v1/status").json()["members"]
                if m["address"] == stuck.address
            )
            assert stuck.proc.poll() is None  # still "generating", still beating
    finally:
        for w in workers:
            w.stop()
        proc.terminate()
        proc.wait(timeout=30)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.session() as s:
            assert check_ledger(s) == []
            twin = s.query(Assignment).filter(Assignment.covers.is_not(None)).one()
            original = s.get_one(Assignment, int(holding[1]))
            assert twin.covers == original.id and twin.worker != stuck.address
            returned = [
                a.closed_at - a.issued_at
                for a in s.query(Assignment).filter(Assignment.state == "returned")
                if a.id != twin.id
            ]
            # covered as a straggler, not as silent: it beat after the twin was issued
            assert beat > twin.issued_at - silence_allowed(HEARTBEAT)
            wait = twin.issued_at - original.issued_at
            assert 4 * min(returned) * 0.9 <= wait < 60
    finally:
        ledger.close()


def test_an_assignment_fills_its_own_share_or_the_one_it_covers():
    assert share_of(7, None) == 7
    assert share_of(9, 7) == 7


# Per assignment: which earlier one it re-issues (None: none), and its file's state.
LEDGER_SHAPES = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 7)),
        st.one_of(st.none(), st.sampled_from(SUBMISSION_STATES)),
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.slow
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(shape=LEDGER_SHAPES)
def test_the_share_queries_agree_with_share_of(tmp_path, shape):
    """SHARE (SQL) finds each assignment's share as `share_of` does, and a share counts as
    won exactly when one of its assignments has a live file. One ledger for every
    example (emptied first): migrating one costs more than the check."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with ledger.session() as s:
            for table in (Submission, Assignment, Member):
                s.execute(delete(table))
            s.add(Member(address="0xw", role="worker", status="healthy", registered_at=0.0))
            s.flush()
            covers = {}
            for i, (earlier, _) in enumerate(shape, start=1):
                # A re-issue names the share's first assignment, never another re-issue.
                first = None if earlier is None else earlier + 1
                covers[i] = (
                    first if first is not None and first < i and covers[first] is None else None
                )
                s.add(
                    Assignment(
                        id=i,
                        worker="0xw",
                        step=0,
                        seed=i,
                        prompts=1,
                        group_size=1,
                        state="issued",
                        issued_at=0.0,
                        deadline=1.0,
                        covers=covers[i],
                    )
                )
            s.flush()
            for i, (_, state) in enumerate(shape, start=1):
                if state is not None:
                    s.add(
                        Submission(
                            file_hash=f"{i:064x}",
                            assignment_id=i,
                            worker="0xw",
                            step=0,
                            stored_name=f"{i}.parquet",
                            size=1,
                            num_samples=1,
                            num_nonzero=1,
                            num_tokens=1,
                            state=state,
                            to_validate=False,
                            uploaded_at=0.0,
                        )
                    )
            s.flush()
            shares = dict(s.execute(select(Assignment.id, SHARE)).all())
            assert shares == {i: share_of(i, c) for i, c in covers.items()}
            live = {"pending", "accepted"}
            for share in set(shares.values()):
                expected = any(
                    shares[i] == share and state in live
                    for i, (_, state) in enumerate(shape, start=1)
                )
                assert won(s.connection(), share) == expected
    finally:
        ledger.close()
