"""The trainer process: asynchronous GRPO, one rollout step at a time.

Per rollout step n (checkpoint n is the newest published):
1. wait until the orchestrator's submissions for step n hold `batch_samples` usable
   samples by the trainer's own count (rewards and advantages recomputed, non-zero
   advantage, policy no older than n - async_level; see `pool_source.py`, `batches.py`),
   logging the time spent waiting, and tell the orchestrator when the step is full;
2. recompute the old logprobs with policy n (the paper did this on the trainer rather
   than trusting the inference engine's numbers);
3. take `optimizer_steps` AdamW steps over minibatches with the GRPO loss (`loss.py`)
   and gradient-norm clipping;
4. (marking the files used as trained in the ledger first) write checkpoint n+1
   atomically, with the optimizer state and this step's metrics, publish it through
   the SHARDCAST origin and announce it (step, BLAKE3) to the orchestrator (`final`
   for the last), then append the metrics line, report the step's curves to the
   orchestrator's dashboard (and, with `--log.backend tensorboard`, to an event file)
   and prune old checkpoints.

One process, or N ranks under torchrun (distributed.py): rank 0 collects the batch and
hands it to every rank, each rank trains on its share with FSDP2 shards (update.py),
the resume state is written sharded (state.py) and the published checkpoint is gathered
once on rank 0 and written as a plain Hugging Face folder.

Resume: a restarted trainer loads the newest checkpoint's weights and optimizer state
and continues at that step; metrics lines of steps that did not finish are dropped and
a finished step's missing line is restored from its checkpoint, so no step is lost or
counted twice.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from swarmrl.checkpoints import (
    load_policy,
    prune_checkpoints,
    save_checkpoint,
    trainer_state_path,
    write_rounded_copy,
)
from swarmrl.config import RunConfig, TrainerConfig
from swarmrl.protocol import PoolClient, PoolRefused, recipe
from swarmrl.protocol.membership import Membership
from swarmrl.rollouts import RolloutBounds
from swarmrl.runfolder import checkpoint_dir, latest_checkpoint
from swarmrl.shardcast.client import server_bytes
from swarmrl.tasks.registry import build_task
from swarmrl.trainer import distributed
from swarmrl.trainer.batches import Sample, step_is_full
from swarmrl.trainer.inputs import RolloutSource, StepCollector
from swarmrl.trainer.metrics import StepMetrics, dashboard_report, read_metrics
from swarmrl.trainer.offpolicy import OffPolicySettings
from swarmrl.trainer.pool_source import PoolRolloutSource
from swarmrl.trainer.sinks import open_sink
from swarmrl.trainer.state import load_trainer_state, save_trainer_state
from swarmrl.trainer.status import TrainerStatus
from swarmrl.trainer.update import (
    UpdateSettings,
    UpdateStats,
    deal_minibatches,
    rollout_update,
)

log = logging.getLogger("swarmrl.trainer")

POLL_SECONDS = 0.25  # between listings of a step's submissions (one signed request each)


def learning_rate(
    done: int, peak: float, warmup: int, total: int, schedule: str, final_ratio: float
) -> float:
    """The learning rate of optimizer step `done` (0-based) of `total`: linear warm-up
    over `warmup` steps to `peak`, then constant or a cosine decay that reaches
    peak × final_ratio at the last step."""
    if warmup and done < warmup:
        return peak * (done + 1) / warmup
    if schedule == "constant" or total <= warmup + 1:
        return peak
    progress = min(1.0, (done - warmup) / (total - warmup - 1))
    return peak * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def enough(collector: StepCollector, tc: TrainerConfig) -> bool:
    """A full batch of usable samples, or (`max_read_ratio`) some usable ones after
    reading max_read_ratio x batch_samples samples for the step."""
    return step_is_full(
        collector.usable, len(collector.all_rewards), tc.batch_samples, tc.max_read_ratio
    )


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        start_model: Path,
        client: PoolClient | None,
        origin_url: str | None = None,
        source: RolloutSource | None = None,
    ) -> None:
        """`client`: the orchestrator (rank 0 registers as the trainer with `origin_url`,
        the URL workers and relays fetch its checkpoints from); `source` replaces the
        orchestrator's submissions as the rollout input (tests)."""
        self.cfg = cfg
        self.client = client
        self.run_dir = cfg.run_dir
        self.folder = cfg.folder
        self.ckpt_root = self.folder.checkpoints
        self.metrics_path = self.folder.metrics
        torch.set_num_threads(cfg.trainer.threads)
        self.ranks = distributed.join()
        latest = latest_checkpoint(self.ckpt_root) if self.ranks.is_main else None
        if latest is None and self.ranks.is_main:
            model, tok = load_policy(start_model)
            save_checkpoint(self.ckpt_root, 0, model, tok)
            latest = 0
        elif self.ranks.is_main:
            log.info("resuming run %s at step %d/%d", cfg.run_name, latest, cfg.trainer.steps)
        latest = distributed.broadcast(self.ranks, latest)
        self.step = latest
        model, self.tok = load_policy(checkpoint_dir(self.ckpt_root, latest))
        tc = cfg.trainer
        # The strict reader's bounds come from the model as loaded (vocabulary, context).
        bounds = RolloutBounds.for_run(
            cfg,
            vocab_size=model.config.vocab_size,
            context_tokens=getattr(model.config, "max_position_embeddings", None),
        )
        if source is None and self.ranks.is_main:
            if client is None:
                raise ValueError("the trainer needs an orchestrator client or a rollout source")
            source = PoolRolloutSource(
                client, self.folder.trainer_inbox, build_task(cfg.task), cfg, self.tok, bounds
            )
        self.source = source
        n_params = sum(p.numel() for p in model.parameters())
        self.precision = distributed.compute_precision(
            tc.precision, distributed.native_bf16(self.ranks.device)
        )
        self.model = distributed.prepare_model(
            model, self.ranks, tc.activation_checkpointing, self.precision
        )
        if self.ranks.is_main:
            log.info(
                "trainer: %.1f M parameters on %d rank(s)%s, %s, %s",
                n_params / 1e6,
                self.ranks.world,
                " sharded with FSDP2" if self.ranks.sharded else "",
                self.ranks.device,
                self.precision if tc.precision != "auto" else f"{self.precision} (auto)",
            )
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay
        )
        self.opt_steps = 0
        state_path = trainer_state_path(self.ckpt_root, latest)
        last_record = None
        if state_path.exists():
            progress = load_trainer_state(state_path, self.model, self.opt, self.ranks)
            self.opt_steps = progress["optimizer_steps"]
            if progress.get("metrics") is not None:
                last_record = StepMetrics.model_validate(progress["metrics"])
        else:
            random.seed(tc.seed)
            torch.manual_seed(tc.seed)
        self.origin = None
        self.membership: Membership | None = None
        if client is not None and not cfg.shardcast.enabled:
            raise ValueError(
                "workers fetch checkpoints through SHARDCAST in a pool: set shardcast.enabled"
            )
        if not self.ranks.is_main:
            return  # rank 0 alone keeps the run folder's files and publishes
        self._repair_metrics(last_record)
        self.events = open_sink(cfg, self.run_dir)
        if self.step < tc.steps:  # a finished run given more steps is not finished any more
            self.folder.trainer_done.unlink(missing_ok=True)
        if cfg.shardcast.enabled:
            from swarmrl.shardcast.origin import Origin

            self.origin = Origin(
                self.folder.shardcast / "origin",
                keep=max(cfg.shardcast.keep, cfg.async_level + 1),
                shard_size=cfg.shardcast.shard_size,
                deltas=cfg.shardcast.deltas,
            )
        if client is not None and client.identity is not None:
            # Registered with the origin's URL, and alive to the orchestrator between
            # its requests (a long step must not get the trainer declared dead).
            self.membership = Membership(
                client.url,
                client.identity,
                "trainer",
                member_url=origin_url,
                policy_step=lambda: self.step,
                # What its origin served (that server's own page, at the URL it registered).
                bytes_served=(lambda: server_bytes(origin_url, timeout=1.0))
                if origin_url
                else lambda: None,
                recipe=recipe.of_run(cfg, "trainer"),
            )
            self.membership.start()
        self._publish(latest, final=latest >= tc.steps)

    def _publish(self, step: int, final: bool = False) -> None:
        """Publish checkpoint `step` through the origin and announce it (step, BLAKE3 of the
        broadcast file) to the orchestrator; both idempotent for a step already out."""
        if self.origin is None:
            return
        listed = self.origin.store.listed()
        if step in listed:
            blake3 = listed[step].blake3
        elif self.cfg.shardcast.dtype == "bf16":
            rounded = write_rounded_copy(
                checkpoint_dir(self.ckpt_root, step), self.folder.shardcast / "rounded" / f"v{step}"
            )
            try:
                blake3 = self.origin.publish(step, rounded).blake3
            finally:
                shutil.rmtree(rounded, ignore_errors=True)
        else:
            blake3 = self.origin.publish(step, checkpoint_dir(self.ckpt_root, step)).blake3
        if self.client is not None:
            self.client.announce_checkpoint(step, blake3, final=final)

    def _report(self, record: StepMetrics) -> None:
        """The step's curves to the orchestrator's dashboard. The file above is the record;
        a refusal here (an orchestrator without the route) costs the dashboard a point,
        not the run its step."""
        if self.client is None:
            return
        try:
            self.client.report_metrics(dashboard_report(record))
        except PoolRefused as exc:
            log.warning(
                "step %d: the orchestrator refused the step's metrics: %s", record.step, exc
            )

    def _repair_metrics(self, last_record: StepMetrics | None) -> None:
        kept = [m for m in read_metrics(self.metrics_path) if m.step < self.step]
        if last_record is not None and not any(m.step == last_record.step for m in kept):
            kept.append(last_record)
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.metrics_path.with_suffix(".tmp")
        tmp.write_text("".join(m.line() for m in kept))
        tmp.replace(self.metrics_path)

    def _lr(self, opt_steps: int | None = None) -> float:
        """The learning rate of optimizer step `opt_steps` (default: the next one)."""
        tc = self.cfg.trainer
        done = self.opt_steps if opt_steps is None else opt_steps
        return learning_rate(
            done,
            tc.lr,
            tc.warmup_steps,
            tc.steps * tc.optimizer_steps,
            tc.lr_schedule,
            tc.lr_final_ratio,
        )

    def _write_status(self, step: int, usable: int, since: float) -> None:
        """Tell `swarmrl run` (its console) how many usable samples the step has and since
        when the trainer has been waiting (unix time); no other role reads it."""
        TrainerStatus(
            step=step, usable=usable, needed=self.cfg.trainer.batch_samples, since=since
        ).write(self.folder.trainer_status)

    def collect(self, step: int) -> tuple[list[Sample], StepCollector, float]:
        assert self.source is not None
        collector = self.source.open_step(step)
        start = last_report = time.perf_counter()
        since = time.time()
        reported = -1
        while True:
            collector.poll()
            if enough(collector, self.cfg.trainer) and collector.drop_withdrawn() == 0:
                collector.report(full=True)
                return (
                    collector.take(self.cfg.trainer.batch_samples),
                    collector,
                    time.perf_counter() - start,
                )
            if collector.usable != reported:
                self._write_status(step, collector.usable, since)
                reported = collector.usable
            if time.perf_counter() - last_report > 60:
                log.warning(
                    "step %d: %d of %d usable samples after %.0f s (%d files read, %d zero-advantage and %d stale "
                    "samples dropped, %d files rejected)",
                    step,
                    collector.usable,
                    self.cfg.trainer.batch_samples,
                    time.perf_counter() - start,
                    len(collector.seen),
                    collector.dropped_zero,
                    collector.dropped_stale,
                    len(collector.rejected),
                )
                last_report = time.perf_counter()
            time.sleep(POLL_SECONDS)

    def train_step(self, samples: list[Sample]) -> UpdateStats:
        """One rollout step's optimizer steps; every rank calls it with the same samples."""
        cfg, tc = self.cfg, self.cfg.trainer
        minibatches = deal_minibatches(len(samples), tc.optimizer_steps)
        lrs = [self._lr(self.opt_steps + i) for i in range(len(minibatches))]
        settings = UpdateSettings(
            temperature=cfg.sampling.temperature,
            max_new_tokens=cfg.sampling.max_new_tokens,
            epsilon=tc.epsilon,
            delta=tc.delta,
            entropy_coef=tc.entropy_coef,
            grad_clip=tc.grad_clip,
            micro_batch_samples=tc.micro_batch_samples,
            off_policy=OffPolicySettings.of(tc),
            max_update_kl=tc.max_update_kl,
            proximal=tc.proximal,
            autocast_bf16=self.precision == "bf16" and not self.ranks.sharded,
        )
        update = rollout_update(
            self.model,
            self.opt,
            samples,
            minibatches,
            lrs,
            settings,
            self.ranks,
            self.tok.pad_token_id,
        )
        self.opt_steps += len(minibatches)
        return update

    def _save(self, step: int, record: dict | None) -> None:
        """Checkpoint `step` (collective): the sharded resume state first, then the weights
        gathered on rank 0 and written as the published model folder."""
        progress = {"optimizer_steps": self.opt_steps, "step": step, "metrics": record}
        state_path = trainer_state_path(self.ckpt_root, step)
        save_trainer_state(state_path, self.model, self.opt, progress, self.ranks)
        weights = distributed.full_state_dict(self.model, self.ranks)
        if self.ranks.is_main:
            save_checkpoint(self.ckpt_root, step, self.model, self.tok, weights)

    def _follow(self) -> None:
        """A rank other than 0: train on rank 0's batches, step for step."""
        while self.step < self.cfg.trainer.steps:
            self.train_step(distributed.broadcast(self.ranks, None))
            self._save(self.step + 1, None)
            self.step += 1

    def run(self, on_step: Callable[[StepMetrics], None] | None = None) -> None:
        if not self.ranks.is_main:
            self._follow()
            distributed.leave(self.ranks)
            return
        tc = self.cfg.trainer
        keep = max(tc.keep_checkpoints, self.cfg.async_level + 1)
        while self.step < tc.steps:
            n = self.step
            t0 = time.perf_counter()
            samples, collector, waited = self.collect(n)
            if self.client is not None:
                # Before training: a trainer killed after this trains step n again and
                # reports the same step, which the ledger counts once.
                self.client.mark_trained(n, collector.files_of(samples))
            distributed.broadcast(self.ranks, samples)
            t1 = time.perf_counter()
            stats = self.train_step(samples)
            train_seconds = time.perf_counter() - t1
            staleness = [n - s.policy_step for s in samples]
            record = StepMetrics(
                step=n,
                time=time.time(),
                reward=float(np.mean(collector.all_rewards)),
                task_reward=float(np.mean(collector.all_task_rewards)),
                length_penalty=float(np.mean(collector.all_length_penalties)),
                length_error=float(np.mean(collector.all_length_errors))
                if collector.all_length_errors
                else math.nan,
                **asdict(stats),
                staleness_mean=float(np.mean(staleness)),
                staleness_max=int(np.max(staleness)),
                oldest_policy_step=int(min(s.policy_step for s in samples)),
                samples=len(samples),
                samples_read=len(collector.all_rewards),
                dropped_zero_advantage=collector.dropped_zero,
                dropped_stale=collector.dropped_stale,
                rejected_files=len(collector.rejected),
                recomputed_mismatch_files=collector.mismatched_files,
                wait_seconds=round(waited, 4),
                train_seconds=round(train_seconds, 4),
                step_seconds=round(time.perf_counter() - t0, 4),
                tokens_per_second=stats.trained_tokens / max(train_seconds, 1e-9),
            )
            self._save(n + 1, record.model_dump())
            self._publish(n + 1, final=n + 1 >= tc.steps)
            with open(self.metrics_path, "a") as fh:
                fh.write(record.line())
            self._report(record)
            if self.events is not None:
                self.events.add_scalars(
                    n, record.model_dump(exclude={"step", "time"}), prefix="train/"
                )
            self.step = n + 1
            prune_checkpoints(self.ckpt_root, keep, protect={0})
            if on_step is not None:
                on_step(record)
        self.folder.trainer_done.write_text(
            json.dumps({"final_step": self.step, "time": time.time()})
        )
        if self.events is not None:
            self.events.finish()
        if self.membership is not None:
            self.membership.stop()
        distributed.leave(self.ranks)
