"""Validate one rollout file end to end and return a verdict: accepted, rejected or unusable.

- *unusable* (exit 2): the validator cannot judge the file: anything the strict reader
  refuses (unreadable Parquet, wrong schema or metadata, a value outside the run's
  bounds, NaN, a step that disagrees with the file's folder), malformed proof bytes, a
  missing checkpoint or config, or an unexpected error while judging. One line.
- *rejected* (exit 1): a check failed; the verdict names the first failing check (in
  ``checks.CHECK_ORDER``) and sample, and lists every failing check. A duplicate (the
  bytes of a file already counted, or an assignment already answered) is rejected.
- *accepted* (exit 0); *skipped* (exit 0): not judged (not chosen, or the claimed
  checkpoint is gone).

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
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

import pyarrow as pa

from swarmrl.assignment import assignment_seed
from swarmrl.config import ConfigError, RunConfig, load_config
from swarmrl.rollouts import (
    AssignmentKey,
    RolloutBounds,
    RolloutFileError,
    RolloutMeta,
    Rollouts,
    SeenFiles,
    check_rollout_table,
    file_hash,
    read_meta,
    read_rollouts,
)
from swarmrl.runfolder import RunFolder, checkpoint_dir
from swarmrl.scoring import completion_text, expected_prompts
from swarmrl.tasks.base import Task
from swarmrl.tasks.registry import build_task
from swarmrl.toploc import ProofFormatError, bytes_to_proofs
from swarmrl.validator import checks
from swarmrl.validator.prefill import recompute
from swarmrl.validator.sampling import replay, sampling_statistics
from swarmrl.validator.settings import ValidatorSettings

log = logging.getLogger("swarmrl.validator")


class UnusableInput(Exception):
    """The validator cannot judge this input; the message is one line saying why."""


class Status(StrEnum):
    """Every verdict a validator gives, with the exit code of `swarmrl validate`."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNUSABLE = "unusable"
    SKIPPED = "skipped"

    @property
    def exit_code(self) -> int:
        return {"accepted": 0, "skipped": 0, "rejected": 1, "unusable": 2}[self.value]


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str  # one line
    failures: tuple[checks.CheckFailure, ...] = ()
    figures: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return self.status.exit_code

    @property
    def failed_checks(self) -> list[str]:
        return sorted({f.check for f in self.failures}, key=checks.CHECK_ORDER.index)

    def to_json(self) -> dict:
        return {
            "status": self.status.value,
            "reason": self.reason,
            "failed_checks": self.failed_checks,
            "failures": [asdict(f) for f in self.failures],
            "figures": self.figures,
        }


def unusable(problem: str) -> Verdict:
    return Verdict(Status.UNUSABLE, f"unusable: {problem}")


def selected_for_validation(file_hash: str, secret: bytes, fraction: float) -> bool:
    """True for about `fraction` of files, decided by HMAC-SHA256(secret, file hash).

    Without the secret a worker cannot predict the choice, so every file risks a check.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    mac = hmac.new(secret, file_hash.encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:8], "big") < fraction * 2.0**64


def file_seed(cfg: RunConfig, meta: RolloutMeta) -> int:
    """The assignment seed of a file built offline (run seed, worker address, step,
    counter); in the pool the orchestrator issues the seed with the assignment."""
    return assignment_seed(cfg.seed, meta.worker_address, meta.step, meta.submission)


def rejected_or_accepted(results: list[checks.CheckResult], figures: dict) -> Verdict:
    failures = tuple(f for r in results for f in r.failures)
    if not failures:
        return Verdict(Status.ACCEPTED, f"accepted: {len(results)} checks passed", (), figures)
    first = failures[0]
    where = f"sample {first.sample}" if first.sample is not None else "file"
    also = [name for name in dict.fromkeys(f.check for f in failures) if name != first.check]
    tail = f" (also failing: {', '.join(also)})" if also else ""
    return Verdict(
        Status.REJECTED,
        f"rejected: {first.check}: {where}: {first.detail}{tail}",
        failures,
        figures,
    )


def rejected(check: str, detail: str) -> Verdict:
    """A verdict for one file-level failure, decided before any model runs."""
    failure = checks.CheckFailure(check, None, detail)
    return rejected_or_accepted([checks.CheckResult(check, (failure,))], {})


def validate_rollouts(
    table: pa.Table,
    meta: RolloutMeta,
    model,
    tokenizer,
    cfg: RunConfig,
    settings: ValidatorSettings | None = None,
    task: Task | None = None,
    seed: int | None = None,
) -> Verdict:
    """Every check on a table from ``read_rollouts``, with the claimed policy loaded.

    Never raises for bad input: whatever the table holds, the answer is a verdict.
    ``task`` saves rebuilding the run's task (re-reading its problem file) per file.
    ``seed`` is the assignment's seed (the orchestrator's); without it, the offline one.
    """
    try:
        if seed is None:
            seed = file_seed(cfg, meta)
        return _validate(
            table, meta, model, tokenizer, cfg, settings or ValidatorSettings(), task, seed
        )
    except RolloutFileError as exc:
        return unusable(exc.problem)
    except UnusableInput as exc:
        return unusable(str(exc))
    except Exception as exc:
        log.error("unexpected error while judging %s", meta.worker_address, exc_info=True)
        return _internal_error(exc)


def _internal_error(exc: Exception) -> Verdict:
    """An error no check foresaw: the file cannot be judged, and the message says why."""
    return unusable(f"error while judging the file: {type(exc).__name__}: {exc}".splitlines()[0])


def _validate(
    table: pa.Table,
    meta: RolloutMeta,
    model,
    tokenizer,
    cfg: RunConfig,
    settings: ValidatorSettings,
    task: Task | None,
    seed: int,
) -> Verdict:
    start = time.perf_counter()
    # The vocabulary is known only now, with the claimed checkpoint loaded.
    check_rollout_table(
        Path(f"<{meta.worker_address} step {meta.step}>"),
        table,
        run_bounds(cfg, vocab_size=model.config.vocab_size),
    )
    rows = Rollouts.from_table(table)
    task = task or build_task(cfg.task)
    eos_id = tokenizer.eos_token_id
    group = cfg.sampling.group_size
    results = [
        checks.check_consistency(
            rows,
            step=meta.step,
            async_level=cfg.async_level,
            group_size=group,
            prompts=cfg.worker.prompts_per_file,
            run_id=meta.run_id,
            expected_run_id=cfg.run_name,
            num_nonzero=meta.num_nonzero,
        )
    ]
    expected, problems = expected_prompts(cfg, seed, task, tokenizer)
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
            alpha=cfg.task.alpha_at(meta.step),
            shaping=cfg.task.length_shaping,
            advantage_mode=cfg.task.advantage_mode,
            group_size=group,
            tolerance=settings.value_tolerance,
        )
    )
    if not results[0].passed:
        # Shapes the model cannot take as a batch: the consistency failure is the verdict.
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
        replay(
            s,
            seed,
            settings.replay_tolerance,
            settings.replay_floor,
            settings.replay_floor_tolerance,
        )
        for s, seed in zip(stats, rows.seed, strict=True)
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


def run_bounds(cfg: RunConfig, vocab_size: int | None = None) -> RolloutBounds:
    """What an honest file of this run can hold (the strict reader's bounds)."""
    return RolloutBounds.for_run(cfg, vocab_size=vocab_size)


def read_rollout_file(path: Path, cfg: RunConfig) -> tuple[pa.Table, RolloutMeta]:
    """The file's checked table and metadata; ``UnusableInput`` for anything the reader refuses."""
    try:
        return read_rollouts(path, run_bounds(cfg))
    except RolloutFileError as exc:
        raise UnusableInput(f"unreadable rollout file: {exc.problem}") from None


def duplicate_verdict(digest: str, meta: RolloutMeta, seen: SeenFiles) -> Verdict | None:
    """Rejected if the file repeats one already counted (same bytes, or same assignment)."""
    reason = seen.duplicate_reason(digest, AssignmentKey.of(meta))
    return rejected("duplicate", reason) if reason else None


def policy_window_verdict(table: pa.Table, meta: RolloutMeta, cfg: RunConfig) -> Verdict | None:
    """Rejected if the claimed policy step lies outside the async bound: decidable without the
    checkpoint (which may never have existed, or be pruned)."""
    policy_step = table.column("policy_step")[0].as_py()
    low = max(0, meta.step - cfg.async_level)
    if low <= policy_step <= meta.step:
        return None
    return rejected(
        "consistency",
        f"policy step {policy_step} outside [{low}, {meta.step}] for step {meta.step}",
    )


def earlier_files(path: Path) -> SeenFiles:
    """The files of ``path``'s folder that arrived before it (modification time, then name),
    as the trainer counts them: the ones this file would duplicate."""
    path = Path(path)
    mine = (path.stat().st_mtime_ns, path.name)
    listed = []
    for other in path.parent.glob("*.parquet"):
        try:
            listed.append(((other.stat().st_mtime_ns, other.name), other))
        except OSError:
            continue  # removed meanwhile
    seen = SeenFiles()
    for order, other in sorted(listed):
        if order >= mine:
            break
        try:
            seen.add(other.name, file_hash(other), AssignmentKey.of(read_meta(other)))
        except (OSError, RolloutFileError):
            continue  # an unreadable file counts for nothing
    return seen


def _load_config(path: Path, config_path: Path | None) -> RunConfig:
    run_dir = Path(path).resolve().parent.parent.parent
    try:
        return load_config(Path(config_path) if config_path else RunFolder(run_dir).config)
    except ConfigError as exc:
        raise UnusableInput(f"{exc} (pass --config)") from None


def _load_model(path: Path, model_dir: Path | None, policy_step: int):
    from swarmrl.checkpoints import load_policy

    run_dir = Path(path).resolve().parent.parent.parent
    model_dir = (
        Path(model_dir)
        if model_dir
        else checkpoint_dir(RunFolder(run_dir).checkpoints, policy_step)
    )
    try:
        return load_policy(model_dir)
    except (OSError, ValueError) as exc:
        raise UnusableInput(
            f"cannot load the claimed checkpoint {model_dir}: {str(exc).splitlines()[0]} (pass --model)"
        ) from None


def judge_file(
    path: Path,
    cfg: RunConfig,
    policy: Callable[[int], Verdict | tuple],
    settings: ValidatorSettings,
    seen: SeenFiles,
    task: Task | None = None,
    seed: int | None = None,
) -> Verdict:
    """One file from disk: strict read, duplicate and policy-window checks, then every check
    with the policy that ``policy(step)`` gives (or the verdict it returns instead).
    ``seed``: the assignment's seed, as the orchestrator issued it.

    Never raises: an unexpected error is logged with its traceback and the file is
    unusable, so a validator always goes on to the next file.
    """
    try:
        table, meta = read_rollout_file(path, cfg)
        early = duplicate_verdict(file_hash(path), meta, seen) or policy_window_verdict(
            table, meta, cfg
        )
        if early is not None:
            return early
        loaded = policy(table.column("policy_step")[0].as_py())
        if isinstance(loaded, Verdict):
            return loaded
        model, tokenizer = loaded
        return validate_rollouts(table, meta, model, tokenizer, cfg, settings, task, seed)
    except UnusableInput as exc:
        return unusable(str(exc))
    except Exception as exc:
        log.error("unexpected error while judging %s", path, exc_info=True)
        return _internal_error(exc)


def validate_file(
    path: Path,
    *,
    model_dir: Path | None = None,
    config_path: Path | None = None,
    settings: ValidatorSettings | None = None,
    seed: int | None = None,
) -> Verdict:
    """Validate one rollout file from disk; never raises for bad input (the verdict says
    'unusable'). Duplicates are judged against the files that arrived before it in its folder.
    ``seed``: the assignment's seed as the orchestrator issued it (``file_seed``, the offline
    derivation, without it)."""
    path = Path(path)
    try:
        cfg = _load_config(path, config_path)
    except UnusableInput as exc:
        try:
            read_rollouts(path)  # a broken file is the first thing to say
        except RolloutFileError as bad:
            return unusable(f"unreadable rollout file: {bad.problem}")
        return unusable(str(exc))
    try:
        seen = earlier_files(path)
    except OSError as exc:
        return unusable(f"{path}: cannot read the file ({exc})")
    return judge_file(
        path,
        cfg,
        lambda step: _load_model(path, model_dir, step),
        settings or ValidatorSettings(),
        seen,
        seed=seed,
    )


def verdict_line(verdict: Verdict, path: Path) -> str:
    return f"{path}: {verdict.reason}"


def verdict_json(verdict: Verdict, path: Path) -> str:
    return json.dumps({"file": str(path), **verdict.to_json()})
