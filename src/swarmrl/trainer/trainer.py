"""The trainer process: asynchronous GRPO, one rollout step at a time.

Per rollout step n (checkpoint n is the newest on disk):
1. wait until `rollouts/step_<n>/` holds `batch_samples` usable samples (non-zero
   advantage, policy no older than n - async_level; see `batches.py`), logging the
   time spent waiting;
2. recompute the old logprobs with policy n (the paper did this on the trainer rather
   than trusting the inference engine's numbers);
3. take `optimizer_steps` AdamW steps over minibatches with the GRPO loss (`loss.py`)
   and gradient-norm clipping;
4. write checkpoint n+1 atomically, with the optimizer state and this step's metrics,
   then append the metrics line and prune old checkpoints.

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
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from swarmrl.checkpoints import (
    checkpoint_dir,
    latest_checkpoint,
    load_policy,
    prune_checkpoints,
    save_checkpoint,
    trainer_state_path,
)
from swarmrl.config import RunConfig
from swarmrl.rollouts import RolloutBounds
from swarmrl.trainer.batches import BatchCollector, Sample
from swarmrl.trainer.loss import GRPOLossInput, grpo_loss, token_logprobs
from swarmrl.trainer.metrics import StepMetrics, read_metrics

log = logging.getLogger("swarmrl.trainer")


def _pad_batch(
    samples: list[Sample], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L], the completion tokens' targets [B, L-1] and mask [B, L-1]."""
    seqs = [s.input_tokens + s.output_tokens for s in samples]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    for i, (s, seq) in enumerate(zip(samples, seqs, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        # Logits at position j predict token j+1: completion tokens are predicted from
        # positions len(prompt)-1 .. len(seq)-2.
        mask[i, len(s.input_tokens) - 1 : len(seq) - 1] = 1.0
    return ids, ids[:, 1:], mask


def _forward_logprobs(model, ids, targets, temperature):
    # Right padding keeps every real token's causal context free of pads: no mask needed.
    logits = model(input_ids=ids).logits[:, :-1]
    return token_logprobs(logits, targets, temperature)


class Trainer:
    def __init__(self, cfg: RunConfig, start_model: Path) -> None:
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        self.folder = cfg.folder
        self.ckpt_root = self.folder.checkpoints
        self.metrics_path = self.folder.metrics
        torch.set_num_threads(cfg.trainer.threads)
        latest = latest_checkpoint(self.ckpt_root)
        if latest is None:
            model, tok = load_policy(start_model)
            save_checkpoint(self.ckpt_root, 0, model, tok)
            latest = 0
        else:
            log.info("resuming run %s at step %d/%d", cfg.run_name, latest, cfg.trainer.steps)
        self.step = latest
        self.model, self.tok = load_policy(checkpoint_dir(self.ckpt_root, latest))
        tc = cfg.trainer
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay
        )
        self.opt_steps = 0
        state_path = trainer_state_path(self.ckpt_root, latest)
        last_record = None
        if state_path.exists():
            state = torch.load(state_path, weights_only=False)
            self.opt.load_state_dict(state["optimizer"])
            self.opt_steps = state["optimizer_steps"]
            random.setstate(state["python_rng"])
            torch.set_rng_state(state["torch_rng"])
            if state.get("metrics") is not None:
                last_record = StepMetrics.model_validate(state["metrics"])
        else:
            random.seed(tc.seed)
            torch.manual_seed(tc.seed)
        self._repair_metrics(last_record)
        if self.step < tc.steps:  # a finished run given more steps is not finished any more
            self.folder.trainer_done.unlink(missing_ok=True)
        self.origin = None
        if cfg.shardcast.enabled:
            from swarmrl.shardcast.origin import Origin

            self.origin = Origin(
                self.folder.shardcast / "origin",
                keep=max(cfg.shardcast.keep, cfg.async_level + 1),
                shard_size=cfg.shardcast.shard_size,
            )
            self._publish(latest)

    def _publish(self, step: int) -> None:
        """Announce checkpoint `step` through the origin (idempotent for a step already listed)."""
        if self.origin is None:
            return
        listed = self.origin.latest_version()
        if listed is None or listed < step:
            self.origin.publish(step, checkpoint_dir(self.ckpt_root, step))

    def _repair_metrics(self, last_record: StepMetrics | None) -> None:
        kept = [m for m in read_metrics(self.metrics_path) if m.step < self.step]
        if last_record is not None and not any(m.step == last_record.step for m in kept):
            kept.append(last_record)
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.metrics_path.with_suffix(".tmp")
        tmp.write_text("".join(m.line() for m in kept))
        tmp.replace(self.metrics_path)

    def _lr(self) -> float:
        warm = self.cfg.trainer.warmup_steps
        return self.cfg.trainer.lr * (min(1.0, (self.opt_steps + 1) / warm) if warm else 1.0)

    def _write_status(self, step: int, usable: int, since: float) -> None:
        """Tell workers how many usable samples the step really has (after the checks
        and filters a file's own metadata cannot know about), and `swarmrl run` since
        when the trainer has been waiting (unix time)."""
        status = self.folder.trainer_status
        tmp = status.with_name(f".{status.name}.tmp")
        tmp.write_text(
            json.dumps(
                {
                    "step": step,
                    "usable": usable,
                    "needed": self.cfg.trainer.batch_samples,
                    "since": since,
                }
            )
        )
        tmp.replace(status)

    def collect(self, step: int) -> tuple[list[Sample], BatchCollector, float]:
        bounds = RolloutBounds.for_run(
            self.cfg,
            vocab_size=self.model.config.vocab_size,
            context_tokens=getattr(self.model.config, "max_position_embeddings", None),
        )
        collector = BatchCollector(
            self.folder.rollout_step(step), step, self.cfg.async_level, bounds=bounds
        )
        start = last_report = time.perf_counter()
        since = time.time()
        reported = -1
        while True:
            collector.poll()
            if collector.usable >= self.cfg.trainer.batch_samples:
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
            time.sleep(0.05)

    def train_step(self, samples: list[Sample]) -> dict:
        cfg, tc = self.cfg, self.cfg.trainer
        temperature = cfg.sampling.temperature
        order = list(range(len(samples)))
        random.shuffle(order)
        minibatches = [order[i :: tc.optimizer_steps] for i in range(tc.optimizer_steps)]
        minibatches = [mb for mb in minibatches if mb]
        pad = self.tok.pad_token_id
        with torch.no_grad():
            old = {}
            for mb in minibatches:
                ids, targets, mask = _pad_batch([samples[i] for i in mb], pad)
                old[tuple(mb)] = _forward_logprobs(self.model, ids, targets, temperature)[0]
        self.model.train()
        grad_norms, clip_ratios, entropies, losses, tokens = [], [], [], [], 0
        for mb in minibatches:
            batch = [samples[i] for i in mb]
            ids, targets, mask = _pad_batch(batch, pad)
            logprobs, entropy = _forward_logprobs(self.model, ids, targets, temperature)
            out = grpo_loss(
                GRPOLossInput(
                    logprobs=logprobs,
                    old_logprobs=old[tuple(mb)],
                    advantages=torch.tensor([s.advantage for s in batch]),
                    mask=mask,
                    token_budget=float(len(batch) * cfg.sampling.max_new_tokens),
                    entropy=entropy,
                ),
                epsilon=tc.epsilon,
                delta=tc.delta,
                entropy_coef=tc.entropy_coef,
            )
            for group in self.opt.param_groups:
                group["lr"] = self._lr()
            self.opt.zero_grad(set_to_none=True)
            out.loss.backward()
            grad_norms.append(
                float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip))
            )
            self.opt.step()
            self.opt_steps += 1
            clip_ratios.append(float(out.clip_ratio))
            entropies.append(float(out.mean_entropy))
            losses.append(float(out.loss.detach()))
            tokens += int(mask.sum())
        self.model.eval()
        return {
            "loss": float(np.mean(losses)),
            "grad_norm": float(np.mean(grad_norms)),
            "grad_norm_max": float(np.max(grad_norms)),
            "clip_ratio": float(np.mean(clip_ratios)),
            "entropy": float(np.mean(entropies)),
            "trained_tokens": tokens,
            "lr": self._lr(),
        }

    def run(self, on_step: Callable[[StepMetrics], None] | None = None) -> None:
        tc = self.cfg.trainer
        keep = max(tc.keep_checkpoints, self.cfg.async_level + 1)
        while self.step < tc.steps:
            n = self.step
            t0 = time.perf_counter()
            samples, collector, waited = self.collect(n)
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
                **stats,
                staleness_mean=float(np.mean(staleness)),
                staleness_max=int(np.max(staleness)),
                oldest_policy_step=int(min(s.policy_step for s in samples)),
                samples=len(samples),
                samples_read=len(collector.all_rewards),
                dropped_zero_advantage=collector.dropped_zero,
                dropped_stale=collector.dropped_stale,
                rejected_files=len(collector.rejected),
                wait_seconds=round(waited, 4),
                train_seconds=round(train_seconds, 4),
                step_seconds=round(time.perf_counter() - t0, 4),
                tokens_per_second=stats["trained_tokens"] / max(train_seconds, 1e-9),
            )
            state = {
                "optimizer": self.opt.state_dict(),
                "optimizer_steps": self.opt_steps,
                "step": n + 1,
                "python_rng": random.getstate(),
                "torch_rng": torch.get_rng_state(),
                "metrics": record.model_dump(),
            }
            save_checkpoint(self.ckpt_root, n + 1, self.model, self.tok, state)
            self._publish(n + 1)
            with open(self.metrics_path, "a") as fh:
                fh.write(record.line())
            self.step = n + 1
            prune_checkpoints(self.ckpt_root, keep, protect={0})
            if on_step is not None:
                on_step(record)
        self.folder.trainer_done.write_text(
            json.dumps({"final_step": self.step, "time": time.time()})
        )
