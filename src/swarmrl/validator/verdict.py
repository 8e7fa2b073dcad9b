"""Validate one rollout file end to end and return a verdict: accepted, rejected or unusable.

- *unusable* (exit 2): the validator cannot judge the file: unreadable Parquet, wrong
  schema, malformed proof bytes, a missing checkpoint or config. The reason is one line.
- *rejected* (exit 1): a check failed; the verdict names the first failing check (in
  ``checks.CHECK_ORDER``) and sample, and lists every failing check.
- *accepted* (exit 0).

The claimed checkpoint is ``<run>/checkpoints/step_<policy_step>`` and the config
``<run>/config.json``, where ``<run>`` is three folders above the file
(``<run>/rollouts/step_<n>/<file>.parquet``), unless given explicitly.

Which files get validated is the caller's choice; ``selected_for_validation`` picks a
fraction of files from their hash and a validator secret, so a worker cannot tell
which of its files will be checked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from swarmrl.assignment import assign
from swarmrl.checkpoints import checkpoint_dir
from swarmrl.config import ConfigError, RunConfig, load_config
from swarmrl.inference.rollout import completion_text
from swarmrl.rollouts import RolloutFileError, RolloutMeta, read_rollouts
from swarmrl.runfolder import RunFolder
from swarmrl.tasks.registry import build_task
from swarmrl.toploc import ProofFormatError, ToplocThresholds, bytes_to_proofs
from swarmrl.validator import checks
from swarmrl.validator.prefill import recompute
from swarmrl.validator.sampling_test import replay, sampling_statistics

# TOPLOC thresholds calibrated for fp32 workers and validators (docs/validator.md): over
# 2,048 honest samples on the tiny model, across batch sizes 64-1,024 and 1-2 threads,
# the worst chunk had 2 exponent mismatches, mean mantissa error 0.008 and median 0 with
# the Hugging Face forward as the validator's prefill (1, 0 and 0 with the fast decoder).
# The paper's 38/10/8 were set for bf16 on GPUs; on fp32 they pass weights perturbed by
# 10% of their spread. Use PAPER_TOPLOC when workers run bf16.
FP32_TOPLOC = ToplocThresholds(max_exp_mismatches=8, max_mant_err_mean=0.5, max_mant_err_median=1.0)
PAPER_TOPLOC = ToplocThresholds()
TOPLOC_PRESETS = {"fp32": FP32_TOPLOC, "paper": PAPER_TOPLOC}


class ValidatorSettings(BaseModel):
    """How strict the validator is; docs/validator.md gives the measured honest spread of each figure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    toploc: ToplocThresholds = Field(
        FP32_TOPLOC,
        description="TOPLOC chunk thresholds (default: calibrated for fp32; PAPER_TOPLOC for bf16)",
    )
    logprob_tolerance: float = Field(
        1e-3, ge=0, description="largest |reported - recomputed| logprob (nats) of any token"
    )
    replay_tolerance: float = Field(
        1e-3,
        ge=0,
        description="slack on the CDF interval a token's seed uniform must fall in (numerical drift)",
    )
    max_replay_misses: int = Field(
        0, ge=0, description="tokens per sample allowed outside their replayed CDF interval"
    )
    min_eos_prob: float = Field(
        0.1,
        ge=0,
        le=1,
        description="an EOS that ends a sample must have had at least this probability ...",
    )
    replay_exempts_eos: bool = Field(
        True, description="... unless the seed replay confirms the worker drew it (an honest draw)"
    )
    sampling_alpha: float = Field(
        1e-6, gt=0, lt=1, description="false-reject rate of each file-level sampling test"
    )
    value_tolerance: float = Field(
        1e-5,
        ge=0,
        description="largest |stored - recomputed| reward, penalty or (relative) advantage",
    )
    token_budget: int = Field(16384, ge=1, description="padded tokens per prefill batch")


class UnusableInput(Exception):
    """The validator cannot judge this input; the message is one line saying why."""


@dataclass(frozen=True)
class Verdict:
    status: str  # "accepted" | "rejected" | "unusable"
    reason: str  # one line
    failures: tuple[checks.CheckFailure, ...] = ()
    figures: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return {"accepted": 0, "rejected": 1, "unusable": 2}[self.status]

    @property
    def failed_checks(self) -> list[str]:
        return sorted({f.check for f in self.failures}, key=checks.CHECK_ORDER.index)

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "reason": self.reason,
            "failed_checks": self.failed_checks,
            "failures": [asdict(f) for f in self.failures],
            "figures": self.figures,
        }


def selected_for_validation(file_hash: str, secret: bytes, fraction: float) -> bool:
    """True for about `fraction` of files, decided by HMAC-SHA256(secret, file hash).

    Without the secret a worker cannot predict the choice, so every file risks a check.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    mac = hmac.new(secret, file_hash.encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:8], "big") < fraction * 2.0**64


def rows_from_table(table: pa.Table) -> checks.Rows:
    return checks.Rows(
        **{name: table.column(name).to_pylist() for name in checks.Rows.__dataclass_fields__}
    )


def _expected_prompts(
    cfg: RunConfig, meta: RolloutMeta, task, tokenizer
) -> tuple[list[checks.ExpectedPrompt], dict]:
    """Row by row, what the assignment seed gives; and the assigned problems by id."""
    plan = assign(
        cfg.seed,
        meta.worker_address,
        meta.step,
        meta.submission,
        num_problems=task.num_train(),
        prompts=cfg.worker.prompts_per_file,
        group_size=cfg.sampling.group_size,
        target_lengths=cfg.task.target_lengths,
    )
    expected, problems = [], {}
    for index, target, seeds in zip(
        plan.problem_indices, plan.target_lengths, plan.sample_seeds, strict=True
    ):
        problem = task.train_problem(index)
        problems[problem.problem_id] = problem
        ids = tokenizer(task.render_prompt(problem, target if target >= 0 else None))["input_ids"]
        expected.extend(
            checks.ExpectedPrompt(problem.problem_id, ids, target, seed) for seed in seeds
        )
    return expected, problems


def rejected_or_accepted(results: list[checks.CheckResult], figures: dict) -> Verdict:
    failures = tuple(f for r in results for f in r.failures)
    if not failures:
        return Verdict("accepted", f"accepted: {len(results)} checks passed", (), figures)
    first = failures[0]
    where = f"sample {first.sample}" if first.sample is not None else "file"
    also = [name for name in dict.fromkeys(f.check for f in failures) if name != first.check]
    tail = f" (also failing: {', '.join(also)})" if also else ""
    return Verdict(
        "rejected", f"rejected: {first.check}: {where}: {first.detail}{tail}", failures, figures
    )


def validate_rollouts(
    table: pa.Table,
    meta: RolloutMeta,
    model,
    tokenizer,
    cfg: RunConfig,
    settings: ValidatorSettings = ValidatorSettings(),
) -> Verdict:
    """Run every check on a schema-checked table (from ``read_rollouts``) with the claimed policy loaded."""
    start = time.perf_counter()
    rows = rows_from_table(table)
    task = build_task(cfg.task)
    eos_id = tokenizer.eos_token_id
    group = cfg.sampling.group_size
    results = [
        checks.check_consistency(
            rows,
            step=meta.step,
            async_level=cfg.async_level,
            group_size=group,
            prompts=cfg.worker.prompts_per_file,
            max_new_tokens=cfg.sampling.max_new_tokens,
            vocab_size=model.config.vocab_size,
            run_id=meta.run_id,
            expected_run_id=cfg.run_name,
            num_nonzero=meta.num_nonzero,
        )
    ]
    expected, problems = _expected_prompts(cfg, meta, task, tokenizer)
    results.append(checks.check_assignment(rows, expected))
    if not results[1].passed:
        # Rewards are only meaningful for the assigned problems; the assignment failure is the verdict.
        return rejected_or_accepted(results, {"samples": len(rows)})
    task_rewards = [
        task.score(problems[pid], completion_text(tokenizer, out, eos_id))
        for pid, out in zip(rows.problem_id, rows.output_tokens, strict=True)
    ]
    results.append(
        checks.check_values(
            rows,
            task_rewards,
            alpha=cfg.task.length_alpha,
            group_size=group,
            tolerance=settings.value_tolerance,
        )
    )
    if not results[0].passed:
        # Token ids or shapes the model cannot take: the consistency failure is the verdict.
        return rejected_or_accepted(results, {"samples": len(rows)})

    hidden_size = model.config.hidden_size
    proofs = []
    for i, (data, out) in enumerate(zip(rows.proofs, rows.output_tokens, strict=True)):
        try:
            proofs.append(bytes_to_proofs(data, n_tokens=len(out), hidden_size=hidden_size))
        except ProofFormatError as exc:
            raise UnusableInput(f"malformed proofs in sample {i}: {exc}") from None

    prefill_start = time.perf_counter()
    stats = recompute(
        model,
        rows.input_tokens,
        rows.output_tokens,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        eos_id=eos_id,
        token_budget=settings.token_budget,
    )
    prefill_seconds = time.perf_counter() - prefill_start
    replays = [
        replay(s, seed, settings.replay_tolerance) for s, seed in zip(stats, rows.seed, strict=True)
    ]
    results.append(
        checks.check_termination(
            rows,
            stats,
            replays,
            eos_id=eos_id,
            max_new_tokens=cfg.sampling.max_new_tokens,
            min_eos_prob=settings.min_eos_prob,
            replay_exempts_eos=settings.replay_exempts_eos,
        )
    )
    results.append(checks.check_toploc([s.hidden for s in stats], proofs, settings.toploc))
    results.append(checks.check_logprobs(rows, stats, settings.logprob_tolerance))
    results.append(
        checks.check_sampling(
            replays,
            sampling_statistics(stats, rows.seed),
            max_replay_misses=settings.max_replay_misses,
            alpha=settings.sampling_alpha,
        )
    )
    figures = {
        "samples": len(rows),
        "completion_tokens": sum(map(len, rows.output_tokens)),
        "prefill_seconds": round(prefill_seconds, 4),
        "seconds": round(time.perf_counter() - start, 4),
    }
    for r in results:
        figures.update({f"{r.name}.{k}": v for k, v in r.figures.items()})
    return rejected_or_accepted(results, figures)


def read_rollout_file(path: Path) -> tuple[pa.Table, RolloutMeta]:
    """The file's schema-checked table and metadata; ``UnusableInput`` if unreadable or empty."""
    try:
        table, meta = read_rollouts(path)
    except RolloutFileError as exc:
        raise UnusableInput(f"unreadable rollout file: {exc}") from None
    if table.num_rows == 0:
        raise UnusableInput(f"{path}: the file has no samples")
    return table, meta


def _load(path: Path, model_dir: Path | None, config_path: Path | None):
    table, meta = read_rollout_file(path)
    run_dir = Path(path).resolve().parent.parent.parent
    config_path = Path(config_path) if config_path else RunFolder(run_dir).config
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        raise UnusableInput(f"{exc} (pass --config)") from None
    policy_step = table.column("policy_step")[0].as_py()
    model_dir = (
        Path(model_dir)
        if model_dir
        else checkpoint_dir(RunFolder(run_dir).checkpoints, policy_step)
    )
    from swarmrl.checkpoints import load_policy

    try:
        model, tokenizer = load_policy(model_dir)
    except (OSError, ValueError) as exc:
        raise UnusableInput(
            f"cannot load the claimed checkpoint {model_dir}: {str(exc).splitlines()[0]} (pass --model)"
        ) from None
    return table, meta, model, tokenizer, cfg


def validate_file(
    path: Path,
    *,
    model_dir: Path | None = None,
    config_path: Path | None = None,
    settings: ValidatorSettings = ValidatorSettings(),
) -> Verdict:
    """Validate one rollout file from disk; never raises for bad input (the verdict says 'unusable')."""
    try:
        table, meta, model, tokenizer, cfg = _load(Path(path), model_dir, config_path)
        return validate_rollouts(table, meta, model, tokenizer, cfg, settings)
    except UnusableInput as exc:
        return Verdict("unusable", f"unusable: {exc}")


def verdict_line(verdict: Verdict, path: Path) -> str:
    return f"{path}: {verdict.reason}"


def verdict_json(verdict: Verdict, path: Path) -> str:
    return json.dumps({"file": str(path), **verdict.to_json()})
