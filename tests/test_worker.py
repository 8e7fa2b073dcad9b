"""The worker's background finisher: proofs and the atomic write happen off the
generation loop, one file in flight, nothing lost at close, errors surfaced."""

from __future__ import annotations

import threading

import pytest

from helpers import random_model
from swarmrl.assignment import assign_from_seed
from swarmrl.generation.rollout import attach_proofs, generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.inference.finisher import FileFinisher
from swarmrl.rollouts import RolloutMeta, read_rollouts
from swarmrl.tasks.arithmetic import ArithmeticTask
from swarmrl.toploc import build_proofs, bytes_to_proofs, proofs_to_bytes


def _batch(counter: int, proofs: bool):
    model, tok = random_model()
    task = ArithmeticTask()
    plan = assign_from_seed(
        7000 + counter,
        num_problems=task.num_train(),
        prompts=2,
        group_size=4,
        target_lengths=[32],
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=12, eos_token_id=tok.eos_token_id)
    batch = generate_rollouts(model, tok, task, plan, params, 0, 0.01, proofs=proofs)
    meta = RolloutMeta(
        run_id="r",
        worker_address="w",
        step=0,
        submission=counter,
        num_samples=8,
        num_nonzero=batch.num_nonzero,
    )
    return batch, meta


def test_deferred_proofs_equal_inline_proofs():
    inline, _ = _batch(0, proofs=True)
    deferred, _ = _batch(0, proofs=False)
    assert deferred.columns["proofs"] == [b""] * 8 and deferred.proof_seconds == 0.0
    attach_proofs(deferred)
    assert deferred.columns["proofs"] == inline.columns["proofs"]
    assert deferred.proof_seconds > 0
    for gen, data in zip(deferred.generations, deferred.columns["proofs"], strict=True):
        split = bytes_to_proofs(data, n_tokens=len(gen.tokens), hidden_size=gen.hidden.shape[1])
        assert proofs_to_bytes(split) == proofs_to_bytes(build_proofs(gen.hidden))


@pytest.mark.slow
def test_finisher_writes_in_the_background_and_reports_the_file_in_flight(tmp_path):
    release = threading.Event()
    written = []

    def on_written(path, batch, meta, waited):
        release.wait(10)  # hold the thread: the file stays in flight until released
        written.append((path, meta.submission, waited))

    finisher = FileFinisher(on_written)
    batch, meta = _batch(0, proofs=False)
    assert finisher.submit(tmp_path / "w-00000.parquet", batch, meta) == 0.0
    pending = finisher.in_flight()
    assert pending is not None and (pending.step, pending.submission, pending.num_nonzero) == (
        0,
        0,
        meta.num_nonzero,
    )
    release.set()
    second, meta2 = _batch(1, proofs=False)
    finisher.submit(tmp_path / "w-00001.parquet", second, meta2)  # waits for the first
    finisher.close()  # writes the second
    assert [s for _, s, _ in written] == [0, 1] and finisher.written == 2
    assert finisher.in_flight() is None
    table, read_meta = read_rollouts(tmp_path / "w-00001.parquet")
    assert read_meta.submission == 1
    assert table.column("proofs").to_pylist() == second.columns["proofs"] and all(
        second.columns["proofs"]
    )
    # The child process built the same bytes as the in-process path.
    again, _ = _batch(1, proofs=True)
    assert second.columns["proofs"] == again.columns["proofs"]


def test_an_error_in_the_background_is_raised_by_the_next_call(tmp_path):
    def on_written(path, batch, meta, waited):
        raise OSError("disk full")

    finisher = FileFinisher(on_written, processes=False)
    batch, meta = _batch(0, proofs=False)
    finisher.submit(tmp_path / "w-00000.parquet", batch, meta)
    with pytest.raises(OSError, match="disk full"):
        finisher.close()


def test_the_proof_process_starts_at_once_and_loads_no_model_code():
    # A worker makes its FinishProcess first thing, so that the child's imports run beside
    # its own: the child must be running before any file is handed to it, and load only
    # the proof and file code (not the sampler, not transformers' model classes).
    import multiprocessing

    from swarmrl.inference.finisher import FinishProcess

    before = {p.pid for p in multiprocessing.active_children()}
    child = FinishProcess()
    try:
        started = {p.pid for p in multiprocessing.active_children()} - before
        assert len(started) == 1
        assert child.pid() in started
        loaded = (
            "[m for m in __import__('sys').modules if m.startswith(('transformers', 'swarmrl'))]"
        )
        modules = set(child._pool.submit(eval, loaded).result())
        assert "swarmrl.toploc.proofs" in modules and "swarmrl.rollouts" in modules
        assert not [m for m in modules if m.startswith(("transformers", "swarmrl.generation"))]
    finally:
        child.close()


@pytest.mark.slow
def test_a_killed_proof_process_is_replaced_and_the_file_still_written(tmp_path):
    import os
    import signal

    from swarmrl.inference.finisher import FinishProcess

    child = FinishProcess()
    try:
        os.kill(child.pid(), signal.SIGKILL)
        batch, meta = _batch(0, proofs=False)
        path = child.finish(tmp_path / "w-00000.parquet", batch, meta)
        assert child.restarts == 1
        table, _ = read_rollouts(path)
        inline, _ = _batch(0, proofs=True)
        assert table.column("proofs").to_pylist() == inline.columns["proofs"]
    finally:
        child.close()
