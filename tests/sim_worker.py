"""A light pool worker as its own process, for tests that stop one with SIGSTOP: it
registers, heartbeats from a thread (`Membership`, as a real worker), takes assignments
and uploads schema-valid rollout files after `gen` seconds of pretend generation.

Prints one line per act: `holding <id> <step> <covers>`, `uploaded <id> <state>`.
Usage: python tests/sim_worker.py URL KEYFILE WORKDIR GEN_SECONDS
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from pool_fixtures import rollout_file
from swarmrl.identity import load_identity
from swarmrl.protocol import PoolClient, PoolRefused
from swarmrl.protocol.membership import Membership


def main(url: str, key: str, workdir: str, gen: float) -> None:
    identity = load_identity(Path(key))
    holding: set[int] = set()
    member = Membership(url, identity, "worker", busy=lambda: bool(holding), retry_base=0.1)
    view = member.start()
    client = PoolClient(url, identity)
    while not view.finished:
        # A fresh view before each request, as the real worker takes one.
        try:
            view = member.beat()
        except ConnectionError:
            view = member.view() or view
        if view.checkpoint is None:
            time.sleep(0.1)
            continue
        answer = client.assignment(view.checkpoint.step)
        work = answer.assignment
        if work is None:
            time.sleep(answer.retry_seconds or 0.1)
            continue
        holding.add(work.id)
        member.nudge()
        print(f"holding {work.id} {work.step}", flush=True)
        time.sleep(gen)
        path = rollout_file(Path(workdir) / f"{work.id}.parquet", identity.address, work)
        try:
            info = client.upload(work.id, path)
            print(f"uploaded {work.id} {info.state}", flush=True)
        except PoolRefused as exc:
            print(f"refused {work.id} {exc.status}", flush=True)
        holding.discard(work.id)
        member.nudge()
    member.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
