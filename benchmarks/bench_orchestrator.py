"""The orchestrator under a simulated pool: many workers with real keys on loopback.

    python benchmarks/bench_orchestrator.py                       # 500 workers, 60 s
    python benchmarks/bench_orchestrator.py --workers 100 --duration 20

One orchestrator process (SQLite ledger, local store) serves ``--workers`` simulated
workers, all asyncio tasks in this process on one aiohttp session (one keep-alive
connection per worker), each with its own secp256k1 key signing every request. Each
worker registers, then heartbeats
every ``--heartbeat`` seconds (start times spread over the first interval) and, every
``--work-every`` seconds, asks for an assignment and uploads a small rollout file
made for it. A trainer announces checkpoints; steps need enough samples that work
never runs out. Reported per endpoint: requests, requests/s, p50 and p99 latency
(request signed and sent → response read), after a warm-up that absorbs the
registration burst; registrations are timed separately. At the end the ledger is checked: every
201 upload is exactly one submission of a returned assignment, nothing else.

The target (issue 11): p99 < 100 ms for heartbeats at 500 workers on 10 s intervals.
Signing and file writing run in this process, on the same cores as the orchestrator;
the CPU time of each process is reported, so the client's share is visible. (An
httpx.AsyncClient shared by all workers saturated this process before the orchestrator:
its connection pool scans every connection on each request.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp

from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.ledger import Ledger, Submission, check_ledger
from swarmrl.protocol import PoolClient
from swarmrl.rollouts import RolloutMeta, write_rollouts

JSON = {"Content-Type": "application/json"}


def rollout_bytes(folder: Path, worker: str, assignment: dict) -> bytes:
    n = assignment["prompts"] * assignment["group_size"]
    columns = {
        "problem_id": ["p"] * n,
        "input_tokens": [[1, 2, 3]] * n,
        "output_tokens": [[4, 5, 6, 7]] * n,
        "output_logprobs": [[-0.5] * 4] * n,
        "rewards": [1.0] * n,
        "task_rewards": [1.0] * n,
        "length_penalties": [0.0] * n,
        "advantages": [0.7] * n,
        "target_lengths": [-1] * n,
        "policy_step": [0] * n,
        "seed": list(range(n)),
        "proofs": [b"\x00" * 258] * n,
    }
    meta = RolloutMeta(
        run_id="bench",
        worker_address=worker,
        step=assignment["step"],
        submission=assignment["id"],
        num_samples=n,
        num_nonzero=n,
    )
    path = write_rollouts(folder / f"{assignment['id']}.parquet", columns, meta)
    data = path.read_bytes()
    path.unlink()
    return data


class Recorder:
    def __init__(self, pool: str, measure_from: float = 0.0) -> None:
        self.pool = pool  # the pool id every request signs
        # Requests sent before measure_from (the registration burst and the first
        # heartbeat interval) are counted in `status` but not timed.
        self.measure_from = measure_from
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, dict[int | str, int]] = defaultdict(lambda: defaultdict(int))

    async def send(self, http, identity, name, method, path, body=b"", digest=None, headers=None):
        """Sign and send one request; its (status, JSON body or None), or None on a
        transport error. Timed from sent to response body read."""
        digest = digest or body_digest(body)
        signed = sign_request(identity, method, path, digest, pool=self.pool) | (headers or {})
        start = time.perf_counter()
        try:
            async with http.request(method, path, data=body, headers=signed) as r:
                payload = await r.read()
                status = r.status
        except (TimeoutError, aiohttp.ClientError) as exc:  # counted, not fatal
            self.status[name][type(exc).__name__] += 1
            return None
        if name == "register" or time.monotonic() >= self.measure_from:
            self.latency[name].append(time.perf_counter() - start)
        self.status[name][status] += 1
        return status, (json.loads(payload) if status < 300 else None)


async def worker_loop(http, rec: Recorder, identity, args, stop_at, scratch, uploads):
    r = None
    while r is None or r[0] != 200:
        r = await rec.send(
            http, identity, "register", "POST", "/v1/register", b'{"role": "worker"}', headers=JSON
        )
    next_beat = time.monotonic() + random.uniform(0, args.heartbeat)
    # --work-every 0: heartbeats only (the latency target is about heartbeats).
    next_work = (
        time.monotonic() + random.uniform(0, args.work_every) if args.work_every else float("inf")
    )
    while True:
        now = time.monotonic()
        if now >= stop_at:
            return
        if now >= next_beat:
            await rec.send(
                http,
                identity,
                "heartbeat",
                "POST",
                "/v1/heartbeat",
                b'{"policy_step": 0}',
                headers=JSON,
            )
            next_beat += args.heartbeat
        if now >= next_work:
            r = await rec.send(
                http,
                identity,
                "assignment",
                "POST",
                "/v1/assignments",
                b'{"policy_step": 0}',
                headers=JSON,
            )
            a = r[1].get("assignment") if r is not None and r[0] == 200 else None
            if a is not None:
                # A worker writes its file on its own machine: off this event loop, so
                # the file's fsync does not stall the other simulated workers' timings.
                data = await asyncio.to_thread(rollout_bytes, scratch, identity.address, a)
                sha = body_digest(data)
                r = await rec.send(
                    http,
                    identity,
                    "upload",
                    "PUT",
                    f"/v1/assignments/{a['id']}/rollout?sha256={sha}",
                    data,
                    digest=sha,
                )
                if r is not None and r[0] == 201:
                    uploads.add(sha)
            next_work += args.work_every
        await asyncio.sleep(max(0.0, min(next_beat, next_work, stop_at) - time.monotonic()))


async def run_pool(url: str, args, scratch: Path) -> tuple[Recorder, set[str], float]:
    with PoolClient(url, None) as public:
        rec = Recorder(public.pool())
    uploads: set[str] = set()
    identities = [Identity.generate() for _ in range(args.workers)]
    # One keep-alive connection per worker at most, as if each were its own machine.
    connector = aiohttp.TCPConnector(limit=args.workers, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as http:
        start = time.monotonic()
        rec.measure_from = start + args.warmup
        stop_at = start + args.warmup + args.duration
        await asyncio.gather(
            *(worker_loop(http, rec, k, args, stop_at, scratch, uploads) for k in identities)
        )
        elapsed = time.monotonic() - rec.measure_from
    return rec, uploads, elapsed


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    """User + system CPU time of this process (all simulated workers), threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of measured load")
    parser.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="seconds of load before timing starts (registrations and first heartbeats)",
    )
    parser.add_argument("--heartbeat", type=float, default=10.0, help="heartbeat interval (s)")
    parser.add_argument(
        "--work-every", type=float, default=20.0, help="seconds between assignments per worker"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-orchestrator-") as tmp:
        tmp = Path(tmp)
        trainer = Identity.generate()
        (tmp / "allowlist").write_text(f"{trainer.address} trainer\n")
        ledger_url = f"sqlite:///{tmp / 'ledger.db'}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "swarmrl.orchestrator",
                "--port",
                "0",
                "--ledger",
                ledger_url,
                "--store",
                str(tmp / "store"),
                "--secret-file",
                str(tmp / "secret"),
                "--allowlist",
                str(tmp / "allowlist"),
                "--run-id",
                "bench",
                "--batch-samples",
                "1000000",
                "--prompts-per-assignment",
                "2",
                "--group-size",
                "2",
                "--rate-per-second",
                "50",
                # every simulated worker registers in the first second: one burst
                "--join-burst",
                str(max(1000, args.workers)),
                "--validation-fraction",
                "0.1",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        try:
            line = proc.stdout.readline()
            if not line.startswith("orchestrator listening on "):
                raise SystemExit(f"orchestrator did not start: {line!r}")
            url = line.split()[-1]
            with PoolClient(url, trainer) as t:
                t.register("trainer")
                t.announce_checkpoint(0, "ab" * 32)
            scratch = tmp / "scratch"
            scratch.mkdir()
            load_before = os.getloadavg()
            cpu_before = process_cpu_seconds(proc.pid)
            client_before = client_cpu_seconds()
            rec, uploads, elapsed = asyncio.run(run_pool(url, args, scratch))
            server_cpu = process_cpu_seconds(proc.pid) - cpu_before
            client_cpu = client_cpu_seconds() - client_before
        finally:
            proc.terminate()
            proc.wait(timeout=60)

        ledger = Ledger(ledger_url)
        with ledger.session() as s:
            problems = check_ledger(s)
            recorded = set(
                s.scalars(Submission.__table__.select().with_only_columns(Submission.file_hash))
            )
        ledger.close()

    sent = max(1, sum(sum(v.values()) for v in rec.status.values()))
    figures = {
        "workers": args.workers,
        "duration_s": round(elapsed, 1),
        "heartbeat_s": args.heartbeat,
        "endpoints": {
            name: {
                "requests": len(lat),
                "per_s": round(len(lat) / elapsed, 1),
                "p50_ms": round(1000 * statistics.median(lat), 1),
                "p99_ms": round(1000 * percentile(lat, 0.99), 1),
                "statuses": dict(rec.status[name]),
            }
            for name, lat in rec.latency.items()
        },
        "server_cpu_s": round(server_cpu, 1),
        "server_cpu_ms_per_request": round(1000 * server_cpu / sent, 2),
        "client_cpu_s": round(client_cpu, 1),
        "client_cpu_ms_per_request": round(1000 * client_cpu / sent, 2),
        "load_average_before": load_before,
        "load_average": os.getloadavg(),
        "uploads_accepted": len(uploads),
        "ledger_submissions": len(recorded),
        "ledger_problems": problems,
        "ledger_matches_uploads": recorded == uploads,
    }
    print(f"{'endpoint':<12}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}  statuses")
    for name, f in figures["endpoints"].items():
        print(
            f"{name:<12}{f['requests']:>10}{f['per_s']:>9}{f['p50_ms']:>9}{f['p99_ms']:>9}  {f['statuses']}"
        )
    total = sum(f["requests"] for f in figures["endpoints"].values())
    print(
        f"all: {total} requests in {elapsed:.1f} s = {total / elapsed:.1f}/s with {args.workers} workers"
    )
    print(
        f"ledger: {len(recorded)} submissions for {len(uploads)} accepted uploads, "
        f"{'identical' if recorded == uploads else 'DIFFERENT'}; consistency problems: {problems or 'none'}"
    )
    print(
        f"orchestrator CPU: {server_cpu:.1f} s = {figures['server_cpu_ms_per_request']} ms per request; "
        f"simulated workers' CPU: {client_cpu:.1f} s = {figures['client_cpu_ms_per_request']} ms per request"
    )
    print(
        f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"on {os.cpu_count()} cores"
    )
    hb = figures["endpoints"].get("heartbeat", {})
    print(f"heartbeat p99 {hb.get('p99_ms')} ms (target < 100 ms)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if not problems and recorded == uploads else 1


if __name__ == "__main__":
    sys.exit(main())
