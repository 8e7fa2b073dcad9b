"""The trainer over a real orchestrator on loopback: it downloads the step's uploads,
recomputes every reward and advantage itself (never training on a worker's numbers),
reports its own count, marks what it trained, announces each checkpoint, and resumes
after a restart without counting anything twice."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from swarmrl.assignment import assign_from_seed
from swarmrl.checkpoints import load_policy
from swarmrl.config import RunConfig, load_config
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.identity import Identity
from swarmrl.ledger import Ledger, Submission, check_ledger
from swarmrl.model.build import WarmStartRecipe, ensure_default_model
from swarmrl.orchestrator import OrchestratorConfig, OrchestratorThread
from swarmrl.protocol import PoolClient, recipe
from swarmrl.protocol import models as api
from swarmrl.rewards import group_advantages, has_signal
from swarmrl.rollouts import RolloutMeta, write_rollouts
from swarmrl.tasks.registry import build_task
from swarmrl.trainer.metrics import read_metrics
from swarmrl.trainer.rescoring import recompute_values
from swarmrl.trainer.trainer import Trainer

GROUP = 8
PROMPTS = 4


@pytest.fixture(scope="module")
def model_dir() -> Path:
    # The same cached warm start as the validator tests: made once per machine.
    return ensure_default_model(
        Path(tempfile.gettempdir()) / "swarmrl-validator-tests", WarmStartRecipe(steps=30)
    )


class Pool:
    """An orchestrator, its trainer key and one worker; files made as an honest worker would."""

    def __init__(
        self, tmp: Path, model_dir: Path, steps: int, run: dict | None = None, **orchestrator
    ) -> None:
        self.tmp = tmp
        self.run_flags = run or {}
        self.cfg = self.config(steps)
        self.trainer_key = Identity.generate()
        self.validator_key = Identity.generate()
        allowlist = tmp / "allowlist"
        allowlist.write_text(
            f"{self.trainer_key.address} trainer\n{self.validator_key.address} validator\n"
        )
        self.orch_config = OrchestratorConfig(
            ledger=f"sqlite:///{tmp / 'ledger.db'}",
            store=str(tmp / "store"),
            secret_file=str(tmp / "secret"),
            allowlist=str(allowlist),
            run_id=self.cfg.run_name,
            steps=steps,
            # Room for several files per step (the trainer says when it has enough).
            batch_samples=8 * self.cfg.trainer.batch_samples,
            prompts_per_assignment=PROMPTS,
            group_size=GROUP,
            async_level=self.cfg.async_level,
            max_open_per_worker=8,
            heartbeat_seconds=120.0,
            # No validator runs here: every file goes to the trainer unchecked.
            validation_fraction=0.0,
            # How the run samples and scores (its recipe): the trainer states them.
            **recipe.scoring_settings(self.cfg),
        )
        self.orch_config = OrchestratorConfig.model_validate(
            self.orch_config.model_dump() | orchestrator
        )
        self.server = OrchestratorThread(self.orch_config)
        self.server.start()
        self.worker = PoolClient(self.server.url, Identity.generate())
        self.worker.register("worker")
        torch.set_num_threads(1)
        self.model, self.tok = load_policy(model_dir)
        self.task = build_task(self.cfg.task)

    def config(self, steps: int) -> RunConfig:
        return load_config(
            None,
            {
                "run_name": "pooled",
                "output_dir": str(self.tmp / "out"),
                "worker.prompts_per_file": PROMPTS,
                "sampling.group_size": GROUP,
                "trainer.steps": steps,
                "trainer.batch_samples": GROUP,
                "trainer.optimizer_steps": 1,
                "shardcast.keep": 2,
                # The model here is random and answers nothing right: only a subtracted
                # length penalty gives its groups a spread of rewards.
                "task.length_shaping": "subtract",
            }
            | self.run_flags,
        )

    def trainer(self, model_dir: Path, steps: int) -> Trainer:
        self.cfg = self.config(steps)
        client = PoolClient(self.server.url, self.trainer_key)
        return Trainer(self.cfg, model_dir, client, origin_url="http://127.0.0.1:9")

    def columns(self, a: api.AssignmentInfo) -> dict:
        plan = assign_from_seed(
            a.seed,
            num_problems=self.task.num_train(),
            prompts=PROMPTS,
            group_size=GROUP,
            target_lengths=self.cfg.task.target_lengths,
        )
        params = SamplingParams(
            temperature=self.cfg.sampling.temperature,
            max_new_tokens=self.cfg.sampling.max_new_tokens,
            eos_token_id=self.tok.eos_token_id,
            top_p=self.cfg.sampling.top_p,
        )
        return generate_rollouts(
            self.model,
            self.tok,
            self.task,
            plan,
            params,
            a.step,
            self.cfg.task.length_alpha,
            length_shaping=self.cfg.task.length_shaping,
        ).columns

    def upload(self, a: api.AssignmentInfo, cols: dict) -> api.SubmissionInfo:
        rewards = cols["rewards"]
        meta = RolloutMeta(
            run_id=self.cfg.run_name,
            worker_address=self.worker.address,
            step=a.step,
            submission=a.id,
            num_samples=len(rewards),
            num_nonzero=sum(
                GROUP for i in range(0, len(rewards), GROUP) if has_signal(rewards[i : i + GROUP])
            ),
        )
        path = write_rollouts(self.tmp / "outbox" / f"{a.id}.parquet", cols, meta)
        return self.worker.upload(a.id, path)

    def honest_upload(
        self, step: int, issued: api.AssignmentInfo | None = None
    ) -> tuple[api.SubmissionInfo, dict]:
        """An honest file for `step` with at least one group that carries signal."""
        for _ in range(6):
            a = issued or self.worker.assignment(step).assignment
            issued = None
            assert a is not None and a.step == step
            cols = self.columns(a)
            if any(
                has_signal(cols["rewards"][i : i + GROUP]) for i in range(0, PROMPTS * GROUP, GROUP)
            ):
                return self.upload(a, cols), cols
            self.upload(a, cols)
        raise AssertionError("no file with a usable group in 6 tries")

    def submissions(self) -> dict[str, Submission]:
        ledger = Ledger(self.orch_config.ledger)
        try:
            with ledger.session() as s:
                assert check_ledger(s) == []
                return {x.file_hash: x for x in s.query(Submission)}
        finally:
            ledger.close()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def pool(tmp_path, model_dir):
    p = Pool(tmp_path, model_dir, steps=1)
    yield p
    p.stop()


def test_inflated_advantages_are_trained_with_the_recomputed_values(pool, model_dir):
    trainer = pool.trainer(model_dir, steps=1)
    view = pool.worker.heartbeat(0)
    assert view.checkpoint is not None and view.checkpoint.step == 0
    assert view.origin == "http://127.0.0.1:9"
    # A liar: every advantage of its file ×50, its rewards claimed perfect.
    a, b = (pool.worker.assignment(0).assignment for _ in range(2))
    cols = pool.columns(a)
    honest_advantages = list(cols["advantages"])
    cols["advantages"] = [50.0 * x + 1.0 for x in cols["advantages"]]
    cols["task_rewards"] = [1.0] * len(cols["task_rewards"])
    honest, _ = pool.honest_upload(0, b)
    liar = pool.upload(a, cols)

    collector = trainer.source.open_step(0)
    collector.poll()
    assert collector.mismatched_files == 1
    assert liar.file_hash in collector.rescorer.mismatched[0][0]
    by_file = {}
    for group in collector.groups:
        by_file.setdefault(collector.files[id(group[0].rows)], []).extend(group)
    for file_hash, samples in by_file.items():
        rows = samples[0].rows
        _, totals, advantages = recompute_values(
            rows.task_rewards,
            rows.target_lengths,
            [len(o) for o in rows.output_tokens],
            alpha=pool.cfg.task.length_alpha,
            group_size=GROUP,
            shaping=pool.cfg.task.length_shaping,
        )
        assert np.allclose(rows.rewards, totals, atol=1e-6)
        assert np.allclose(rows.advantages, advantages, atol=1e-5)
        if file_hash == liar.file_hash:
            # Recomputed: what the honest worker would have written, not the lie.
            assert np.allclose(rows.advantages, honest_advantages, atol=1e-5)
            assert max(abs(x) for x in rows.advantages) < 3.0
    # The trainer's own count went to the orchestrator: the step's usable samples are
    # the trainer's, not the liar's claim.
    status = PoolClient(pool.server.url, None).status()
    step0 = next(s for s in status.steps if s.step == 0)
    assert step0.usable_samples == collector.usable
    assert step0.read_samples == len(collector.all_rewards)

    trainer.run()
    record = read_metrics(pool.cfg.folder.metrics)[-1]
    assert record.step == 0 and record.recomputed_mismatch_files == 1
    subs = pool.submissions()
    trained = {h for h, s in subs.items() if s.trained_step == 0}
    assert trained and trained <= {liar.file_hash, honest.file_hash}
    view = pool.worker.heartbeat(0)
    assert view.checkpoint.step == 1 and view.finished
    listed = trainer.origin.store.listed()
    assert view.checkpoint.blake3 == listed[1].blake3


def test_a_file_voided_after_it_was_read_is_not_trained(tmp_path, model_dir):
    # The trainer has read a file when its worker is caught on another one (checked at
    # the new-member rate): the file read but not trained is voided, and dropped.
    pool = Pool(
        tmp_path, model_dir, 1, validation_fraction=1e-12, new_member_files=1, batch_samples=512
    )
    try:
        trainer = pool.trainer(model_dir, steps=1)
        validator = PoolClient(pool.server.url, pool.validator_key)
        validator.register("validator")
        pool.honest_upload(0)  # the cheat's first file: checked
        caught = validator.next_for_validation().submission
        first, _ = pool.honest_upload(0)
        pool.worker = PoolClient(pool.server.url, Identity.generate())
        pool.worker.register("worker")
        second, _ = pool.honest_upload(0)
        while (handed := validator.next_for_validation()).submission is not None:
            validator.post_verdict(handed.submission.file_hash, True)
        collector = trainer.source.open_step(0)
        collector.poll()
        read = set(collector.files.values())
        assert {first.file_hash, second.file_hash} <= read
        validator.post_verdict(caught.file_hash, False, "rejected: toploc: sample 0")
        assert collector.drop_withdrawn() > 0
        # The drop is reported: the orchestrator issues by the trainer's count without it.
        step0 = next(s for s in PoolClient(pool.server.url, None).status().steps if s.step == 0)
        assert step0.usable_samples == collector.usable
        used = collector.files_of(collector.take(10**6))
        assert first.file_hash not in used and second.file_hash in used
        assert collector.drop_withdrawn() == 0
        assert pool.submissions()[first.file_hash].state == "voided"  # check_ledger inside
    finally:
        pool.stop()


def test_group_advantages_are_recomputed_from_verified_rewards():
    # Two groups of 2: the second has no signal (equal rewards) and zero advantages.
    penalties, totals, advantages = recompute_values(
        [1.0, 0.0, 1.0, 1.0],
        [4, -1, 4, 4],
        [6, 3, 4, 4],
        alpha=0.5,
        group_size=2,
        shaping="subtract",
    )
    assert penalties == [1.0, 0.0, 0.0, 0.0]
    assert totals == [0.0, 0.0, 1.0, 1.0]
    assert advantages == pytest.approx([0.0, 0.0, 0.0, 0.0], abs=1e-6)
    _, _, advantages = recompute_values([1.0, 0.0], [-1, -1], [3, 3], alpha=0.5, group_size=2)
    assert advantages == pytest.approx(group_advantages([1.0, 0.0]).tolist())
    with pytest.raises(ValueError, match="do not fill groups"):
        recompute_values([1.0], [-1], [3], alpha=0.5, group_size=2)


def test_a_restarted_trainer_resumes_and_counts_nothing_twice(tmp_path, model_dir):
    pool = Pool(tmp_path, model_dir, steps=2)
    try:
        trainer = pool.trainer(model_dir, steps=1)
        first, _ = pool.honest_upload(0)
        trainer.run()  # step 0 trained; checkpoint 1 published (the final one of a 1-step run)
        del trainer
        # Restarted with the run's real length: it resumes at step 1, re-announces
        # checkpoint 1 (the same hash), and trains step 1 from new uploads.
        trainer = pool.trainer(model_dir, steps=2)
        assert trainer.step == 1
        second, _ = pool.honest_upload(1)
        trainer.run()
        subs = pool.submissions()  # check_ledger clean inside
        assert subs[first.file_hash].trained_step == 0
        assert subs[second.file_hash].trained_step == 1
        assert [m.step for m in read_metrics(pool.cfg.folder.metrics)] == [0, 1]
        view = pool.worker.heartbeat(1)
        assert view.checkpoint.step == 2 and view.finished
    finally:
        pool.stop()


def test_mlflow_logs_one_run_across_a_restart(tmp_path, model_dir):
    """--log.backend mlflow into the default SQLite store, read back with MLflow's own
    client, offline: a restarted trainer continues the MLflow run it started."""
    from mlflow.tracking import MlflowClient

    pool = Pool(tmp_path, model_dir, steps=2, run={"log.backend": "mlflow"})
    try:
        trainer = pool.trainer(model_dir, steps=1)
        pool.honest_upload(0)
        trainer.run()
        del trainer
        trainer = pool.trainer(model_dir, steps=2)
        pool.honest_upload(1)
        trainer.run()
        records = read_metrics(pool.cfg.folder.metrics)
    finally:
        pool.stop()
    store = pool.cfg.run_dir / "mlflow" / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("swarmrl").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == (pool.cfg.run_dir / "mlflow_run_id").read_text().strip()
    assert run.info.status == "FINISHED" and run.info.run_name == "pooled"
    assert run.data.params["trainer.steps"] == "1"  # logged once, by the first start
    assert run.data.params["log.backend"] == "mlflow"
    for name in ("reward", "task_reward", "grad_norm", "samples"):
        history = client.get_metric_history(run.info.run_id, f"train/{name}")
        shown = sorted((m.step, m.value) for m in history)
        assert shown == [(r.step, pytest.approx(float(getattr(r, name)))) for r in records], name
