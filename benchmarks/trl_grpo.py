"""TRL's GRPOTrainer on swarmrl's model, task, reward and sample budget: the comparison run.

`benchmarks/bench_learning.py` starts this script as a subprocess, so its wall time and
CPU-seconds are measured exactly like a `swarmrl run`'s. It takes the same configuration
flags as `swarmrl run` (`--seed`, `--trainer.steps`, `--trainer.lr`, `--model.path`, ...),
composes the same `RunConfig`, and maps each recipe field onto TRL's `GRPOConfig`, so
a default the trainer's owner changes in config.py reaches both sides of the comparison.
TRL is used as a library; nothing of it is copied here.

What is the same as `swarmrl run`:
- model: the start model directory (default: the embedded one), fp32 weights; the
  training computes in bf16 mixed precision (TRL's `bf16=True`) where
  `trainer.precision` resolves to bf16 (bf16, or auto where the device multiplies bf16
  natively), as swarmrl's trainer then does;
- task and prompts: the configured task's training problems, rendered by the task's own
  `render_prompt`, each with a target length drawn from `task.target_lengths`;
- reward: the task's verifier minus `task.length_alpha`·|target − completion length|
  (`swarmrl.rewards.score_sample`, with `task.length_shaping`; the length counts the EOS
  token, as the workers do);
- advantages by `task.advantage_mode`: joint is TRL's group-std advantage of the total
  reward; decoupled gives TRL two reward functions (the task reward and the negated
  length penalty) aggregated with `multi_objective_aggregation="normalize_then_sum"`
  (each normalized within its group and summed: GDPO, which TRL then normalizes over
  the batch where swarmrl normalizes the sum within the group again); centered is
  `scale_rewards="none"` (the total reward less its group mean);
- sampling: temperature, top_p, `max_new_tokens`, group size G; the loss divides logits
  by the same temperature;
- budget: `trainer.steps` generation batches of `trainer.batch_samples` samples
  (default 50 × 128 = 6,400), each split into `trainer.optimizer_steps` optimizer steps;
- loss: token-level GRPO, two-sided clip (`epsilon`, `delta`), constant token-budget
  normalization (TRL's `dr_grpo`), group-std advantages, no KL term;
- optimizer: AdamW with the trainer's lr, betas, weight decay, gradient clip, warm-up
  and schedule (constant, or cosine to `lr_final_ratio`);
- evaluation: `swarmrl.evaluation.evaluate`, the code `swarmrl run` evaluates with.

What differs, because TRL works that way:
- TRL samples with `model.generate` in the training process, synchronously (on policy):
  `trainer.off_policy` and `async_level` do not apply;
- no online filtering: a group whose rewards are all equal stays in the batch (its
  advantage is zero, so it adds nothing to the gradient but counts in the normalizer),
  where swarmrl waits for `batch_samples` samples with signal. TRL thus generates
  exactly the budget; swarmrl's workers generate more than they train on.

    python benchmarks/trl_grpo.py --out DIR [--threads N] [any `swarmrl run` config flag]

Writes DIR/metrics.jsonl (one line per rollout step: the time it finished, and its
batch's mean task reward, reward and length error), DIR/model (the trained model) and DIR/summary.json, and prints
the summary.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports: startup is part of the comparison

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from swarmrl.config import RunConfig, add_config_arguments, config_from_args  # noqa: E402
from swarmrl.evaluation import evaluate  # noqa: E402
from swarmrl.model.build import ensure_default_model  # noqa: E402
from swarmrl.rewards import score_sample  # noqa: E402
from swarmrl.tasks.base import Task  # noqa: E402
from swarmrl.tasks.registry import build_task  # noqa: E402
from swarmrl.trainer.distributed import compute_precision, native_bf16  # noqa: E402


def training_prompts(task: Task, cfg: RunConfig) -> Dataset:
    """One row per prompt of the budget: `trainer.steps` × batch_samples / G prompts.

    Problems and targets are drawn uniformly with `cfg.seed`, as the orchestrator's
    assignments draw them (a different stream, the same distribution).
    """
    group = cfg.sampling.group_size
    if cfg.trainer.batch_samples % group:
        raise SystemExit(
            f"trainer.batch_samples ({cfg.trainer.batch_samples}) must be a multiple of "
            f"sampling.group_size ({group}): TRL batches whole groups"
        )
    rng = random.Random(cfg.seed)
    count = cfg.trainer.steps * cfg.trainer.batch_samples // group
    indices = [rng.randrange(task.num_train()) for _ in range(count)]
    targets = [
        rng.choice(cfg.task.target_lengths) if cfg.task.target_lengths else -1 for _ in indices
    ]
    return Dataset.from_dict(
        {
            "prompt": [
                task.render_prompt(task.train_problem(i), t if t >= 0 else None)
                for i, t in zip(indices, targets, strict=True)
            ],
            "problem_index": indices,
            "target": targets,
        }
    )


class SwarmReward(TrainerCallback):
    """TRL reward function: swarmrl's reward; and a callback that writes one metrics line
    per rollout step when its last optimizer step ends (the time means what the
    trainer's metrics.jsonl `time` means: the step finished)."""

    __name__ = "swarmrl_reward"  # TRL names the reward's log entries after it

    def __init__(self, task: Task, cfg: RunConfig, metrics: Path) -> None:
        self.task, self.metrics = task, metrics
        self.alpha, self.shaping = cfg.task.length_alpha, cfg.task.length_shaping
        self.optimizer_steps = cfg.trainer.optimizer_steps
        # Decoupled advantages: this function returns the task reward alone and
        # `LengthPart` the negated length penalty, which TRL normalizes apart.
        self.decoupled = cfg.task.advantage_mode == "decoupled"
        self.penalties: list[float] = []
        self.pending: dict | None = None
        self.steps = 0

    def __call__(self, prompts, completions, completion_ids, problem_index, target, **_) -> list:
        rewards, task_rewards, errors = [], [], []
        for text, ids, index, t in zip(
            completions, completion_ids, problem_index, target, strict=True
        ):
            problem = self.task.train_problem(int(index))
            goal = int(t) if int(t) >= 0 else None
            r = score_sample(
                self.task.score(problem, text), goal, len(ids), self.alpha, self.shaping
            )
            rewards.append(r.total)
            if self.decoupled:
                self.penalties.append(r.length_penalty)
            task_rewards.append(r.task_reward)
            if goal is not None:
                errors.append(abs(goal - len(ids)))
        self.pending = {
            "samples": len(rewards),
            "reward": sum(rewards) / len(rewards),
            "task_reward": sum(task_rewards) / len(task_rewards),
            "length_error": sum(errors) / len(errors) if errors else float("nan"),
        }
        return task_rewards if self.decoupled else rewards

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.optimizer_steps == 0 and self.pending is not None:
            record = {"step": self.steps, "time": time.time(), **self.pending}
            with self.metrics.open("a") as f:
                f.write(json.dumps(record) + "\n")
            self.steps += 1
            self.pending = None
        return control


class LengthPart:
    """TRL's second reward function under decoupled advantages: the negated length
    penalties `SwarmReward` computed for the same completions (TRL calls the functions
    in order, on one batch)."""

    __name__ = "swarmrl_length"

    def __init__(self, reward: SwarmReward) -> None:
        self.reward = reward

    def __call__(self, prompts, completions, **_) -> list:
        penalties = self.reward.penalties
        if len(penalties) != len(completions):
            raise RuntimeError("the length part was called out of step with the task reward")
        self.reward.penalties = []
        return [-p for p in penalties]


def advantage_settings(mode: str) -> dict:
    """`task.advantage_mode` in GRPOConfig's terms (module docstring)."""
    if mode == "decoupled":
        return {"scale_rewards": "group", "multi_objective_aggregation": "normalize_then_sum"}
    if mode == "centered":
        return {"scale_rewards": "none"}
    return {"scale_rewards": "group"}


def grpo_config(cfg: RunConfig, out: Path) -> GRPOConfig:
    """swarmrl's recipe in TRL's terms (module docstring: what maps and what cannot)."""
    t, s = cfg.trainer, cfg.sampling
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = compute_precision(t.precision, native_bf16(device)) == "bf16"
    if t.batch_samples % t.optimizer_steps:
        raise SystemExit(
            f"trainer.batch_samples ({t.batch_samples}) must split evenly into "
            f"trainer.optimizer_steps ({t.optimizer_steps}) minibatches"
        )
    schedule = (
        {"lr_scheduler_type": "constant_with_warmup"}
        if t.lr_schedule == "constant"
        else {
            "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": t.lr_final_ratio},
        }
    )
    return GRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=t.steps * t.optimizer_steps,
        per_device_train_batch_size=t.batch_samples // t.optimizer_steps,
        steps_per_generation=t.optimizer_steps,
        gradient_accumulation_steps=1,
        num_iterations=1,
        num_generations=s.group_size,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=0,
        learning_rate=t.lr,
        warmup_steps=t.warmup_steps,
        **schedule,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip,
        epsilon=t.epsilon,
        delta=t.delta,
        beta=0.0,
        loss_type="dr_grpo",
        **advantage_settings(cfg.task.advantage_mode),
        entropy_coef=t.entropy_coef,
        seed=t.seed,
        data_seed=cfg.seed,
        bf16=bf16,
        # transformers refuses bf16 without a GPU unless told it runs on the CPU
        use_cpu=bf16 and device.type == "cpu",
        activation_checkpointing=False,
        dataloader_pin_memory=False,
        logging_steps=t.optimizer_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's own, every core: TRL generates and trains in one process)",
    )
    add_config_arguments(parser)
    args = parser.parse_args()
    cfg = config_from_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    metrics = args.out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)

    start_model = Path(cfg.model.path) if cfg.model.path else ensure_default_model()
    task = build_task(cfg.task)
    before = evaluate(start_model, task, cfg) if cfg.eval_before else None

    tokenizer = AutoTokenizer.from_pretrained(start_model)
    model = AutoModelForCausalLM.from_pretrained(start_model, dtype=torch.float32)
    reward = SwarmReward(task, cfg, metrics)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward, LengthPart(reward)] if reward.decoupled else reward,
        args=grpo_config(cfg, args.out),
        train_dataset=training_prompts(task, cfg),
        processing_class=tokenizer,
        callbacks=[reward],
    )
    train_start = time.time()
    trainer.train()
    train_seconds = time.time() - train_start
    final = args.out / "model"
    trainer.save_model(str(final))

    after = evaluate(final, task, cfg) if cfg.eval_after else None
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary = {
        "trl_version": trl.__version__,
        "start_model": str(start_model),
        "accuracy_before": before.accuracy if before is not None else None,
        "accuracy_after": after.accuracy if after is not None else None,
        "length_error_before": before.length_error if before is not None else None,
        "length_error_after": after.length_error if after is not None else None,
        "steps": len(records),
        "samples_generated": sum(r["samples"] for r in records),
        "optimizer_steps": trainer.state.global_step,
        "first_step_seconds": round(records[0]["time"] - STARTED, 1) if records else None,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(time.time() - STARTED, 1),
        "torch_threads": torch.get_num_threads(),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
