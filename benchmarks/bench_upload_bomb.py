"""Memory of a real `swarmrl orchestrator` process while it refuses upload bombs.

A registered worker uploads, for its own open assignment (2 prompts x 2 samples = 4
rows), Parquet files of a few kB whose zero-token columns decode to tens or hundreds of
MiB, and one whose footer is forged to claim 64 values and 2 kB per column chunk while
its pages hold 16 M tokens (`tests/parquet_forge.py`). For each, in a fresh process
after one small upload has warmed the upload path, the process's peak resident memory
(VmHWM) before and after the refused upload.

    python benchmarks/bench_upload_bomb.py [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from parquet_forge import understate_footer
from swarmrl.identity import Identity
from swarmrl.protocol import PoolClient, PoolRefused
from swarmrl.rollouts import RolloutMeta, write_rollouts

# (rows, tokens per row, footer forged); the last is honest-sized
SHAPES = [(384, 16_384, False), (4, 1 << 20, False), (4, 1 << 22, True), (4, 64, False)]


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def bomb(path: Path, worker: str, step: int, assignment: int, rows: int, tokens: int) -> Path:
    offsets = pa.array(np.arange(0, (rows + 1) * tokens, tokens, dtype=np.int32))
    zeros = np.zeros(rows * tokens, dtype=np.int32)
    columns = {
        "problem_id": [f"p{i // 2}" for i in range(rows)],
        "input_tokens": [[1, 2, 3]] * rows,
        "output_tokens": pa.ListArray.from_arrays(offsets, pa.array(zeros)),
        "output_logprobs": pa.ListArray.from_arrays(offsets, pa.array(zeros.astype(np.float32))),
        "rewards": [1.0] * rows,
        "task_rewards": [1.0] * rows,
        "length_penalties": [0.0] * rows,
        "advantages": [float("nan")] * rows,  # refused after decoding, if it gets that far
        "target_lengths": [-1] * rows,
        "policy_step": [step] * rows,
        "seed": list(range(rows)),
        "proofs": [b"\x00" * 4] * rows,
    }
    meta = RolloutMeta.model_construct(
        run_id="bench",
        worker_address=worker,
        step=step,
        submission=assignment,
        num_samples=rows,
        num_nonzero=rows,
    )
    return write_rollouts(path, columns, meta)


def refuse_one(rows: int, tokens: int, forged: bool, max_new_tokens: str) -> tuple[int, str, float]:
    """In a fresh orchestrator: (file bytes, outcome, peak RSS growth in MiB)."""
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        trainer = Identity.generate()
        (tmp / "allowlist").write_text(f"{trainer.address} trainer\n")
        command = [
            sys.executable, "-m", "swarmrl.orchestrator", "--port", "0",
            "--ledger", f"sqlite:///{tmp / 'ledger.db'}", "--store", str(tmp / "store"),
            "--secret-file", str(tmp / "secret"), "--allowlist", str(tmp / "allowlist"),
            "--run-id", "bench", "--prompts-per-assignment", "2", "--group-size", "2",
        ]  # fmt: skip
        if max_new_tokens:
            command += ["--max-new-tokens", max_new_tokens]
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"}
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[-1]
            PoolClient(url, trainer).register("trainer")
            PoolClient(url, trainer).announce_checkpoint(0, "ab" * 32)
            worker = PoolClient(url, Identity.generate())
            worker.register("worker")
            # A first, small refused upload warms what every upload uses (the reader, its
            # memory pool, the spool): the figure is what this file adds.
            warm = worker.assignment(0).assignment
            assert warm is not None
            with contextlib.suppress(PoolRefused):
                worker.upload(warm.id, bomb(tmp / "warm.parquet", worker.address, 0, warm.id, 4, 8))
            a = worker.assignment(0).assignment
            assert a is not None
            path = bomb(tmp / "bomb.parquet", worker.address, 0, a.id, rows, tokens)
            if forged:
                path = understate_footer(path, tmp / "forged.parquet", 64, 2048)
            before = peak_rss_kib(proc.pid)
            try:
                worker.upload(a.id, path)
                outcome = "accepted"
            except PoolRefused as exc:
                outcome = f"refused {exc.status}"
            return path.stat().st_size, outcome, (peak_rss_kib(proc.pid) - before) / 1024
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", default="64", help="'' for the version's default")
    args = parser.parse_args()
    print(
        f"{'rows x tokens':>16} {'footer':>6} {'file bytes':>10} {'decoded MiB':>11} {'peak RSS +MiB':>13}"
    )
    for rows, tokens, forged in SHAPES:
        size, outcome, grown = refuse_one(rows, tokens, forged, args.max_new_tokens)
        decoded = rows * tokens * 8 / 2**20
        footer = "forged" if forged else "honest"
        print(
            f"{rows:>6} x {tokens:<8} {footer:>6} {size:>10} {decoded:>11.0f} {grown:>13.1f}  ({outcome})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
