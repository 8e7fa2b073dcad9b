"""Cheating workers the validator must reject with the reason named, and honest ones it must accept.

Every cheater here starts from what an honest worker would upload for its assignment
and changes one thing, redoing whatever else a careful cheater would redo so that only
the cheat itself is visible (for example rewards and advantages recomputed after a
truncation, proofs rebuilt by prefilling the claimed model). The honest workers differ
in batch size, thread count and batch composition; none of their 2,048 samples may be
rejected.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import operator
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from swarmrl.assignment import Assignment, assign
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import completion_text, generate_rollouts
from swarmrl.generation.sampler import SamplingParams, sample
from swarmrl.model.build import WarmStartRecipe, ensure_default_model
from swarmrl.rewards import group_advantages, has_signal, score_sample
from swarmrl.rollouts import RolloutMeta, read_rollouts, write_rollouts
from swarmrl.tasks.base import Problem
from swarmrl.tasks.registry import build_task
from swarmrl.toploc import build_proofs, encode_proof, proofs_to_bytes
from swarmrl.validator import cli as validator_cli
from swarmrl.validator import validate_file, validate_rollouts
from swarmrl.validator.prefill import recompute
from swarmrl.validator.settings import ValidatorSettings

ADDRESS = "0xworker"
STEP = 0


@dataclasses.dataclass
class Swarm:
    run_dir: Path
    cfg: object
    model: torch.nn.Module
    tok: object
    task: object
    params: SamplingParams


@pytest.fixture(scope="module")
def swarm(tmp_path_factory) -> Swarm:
    # Cached across test runs: the 30-step warm start takes about a minute on a busy 2-core machine.
    model_dir = ensure_default_model(
        Path(tempfile.gettempdir()) / "swarmrl-validator-tests", WarmStartRecipe(steps=30)
    )
    # A folder of its own each time: under xdist a worker may build this module fixture
    # more than once (the module's tests are not contiguous on one worker).
    output_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(
        None,
        {
            "run_name": "valtest",
            "output_dir": str(output_dir),
            "worker.prompts_per_file": 4,
            "sampling.group_size": 8,
        },
    )
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    os.symlink(model_dir, run_dir / "checkpoints" / "step_000000")
    torch.set_num_threads(1)
    model, tok = load_policy(model_dir)
    params = SamplingParams(
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        top_p=cfg.sampling.top_p,
    )
    return Swarm(run_dir, cfg, model, tok, build_task(cfg.task), params)


def assignment(s: Swarm, counter: int, prompts: int | None = None) -> Assignment:
    return assign(
        s.cfg.seed,
        ADDRESS,
        STEP,
        counter,
        num_problems=s.task.num_train(),
        prompts=prompts or s.cfg.worker.prompts_per_file,
        group_size=s.cfg.sampling.group_size,
        target_lengths=s.cfg.task.target_lengths,
    )


def write(
    s: Swarm, counter: int, columns: dict, name: str | None = None, run_dir: Path | None = None
) -> Path:
    """Write a file for assignment `counter` into the run's step folder (or `run_dir`'s: a
    cheat of an already answered assignment would otherwise be a duplicate there)."""
    g = s.cfg.sampling.group_size
    rewards = columns["rewards"]
    nonzero = sum(g for i in range(0, len(rewards), g) if has_signal(rewards[i : i + g]))
    meta = RolloutMeta(
        run_id=s.cfg.run_name,
        worker_address=ADDRESS,
        step=STEP,
        submission=counter,
        num_samples=len(rewards),
        num_nonzero=nonzero,
    )
    folder = (run_dir or s.run_dir) / "rollouts" / f"step_{STEP:06d}"
    return write_rollouts(folder / (name or f"{ADDRESS}-{counter:05d}.parquet"), columns, meta)


def honest_columns(s: Swarm, counter: int) -> dict:
    return generate_rollouts(
        s.model, s.tok, s.task, assignment(s, counter), s.params, STEP, s.cfg.task.length_alpha
    ).columns


def judge(s: Swarm, path: Path):
    table, meta = read_rollouts(path)
    return validate_rollouts(table, meta, s.model, s.tok, s.cfg)


def rescore(s: Swarm, cols: dict) -> dict:
    """What a careful cheater does after changing completions: consistent rewards and advantages."""
    problems = {}
    for pid in cols["problem_id"]:
        a, b = (int(x) for x in pid.split("-")[1:])  # arithmetic ids are add-<a>-<b>
        problems[pid] = Problem(pid, f"{a}+{b}", str(a + b))
    cols["task_rewards"], cols["length_penalties"], cols["rewards"] = [], [], []
    for pid, out, target in zip(
        cols["problem_id"], cols["output_tokens"], cols["target_lengths"], strict=True
    ):
        r = score_sample(
            s.task.score(problems[pid], completion_text(s.tok, out, s.tok.eos_token_id)),
            target,
            len(out),
            s.cfg.task.length_alpha,
        )
        cols["task_rewards"].append(r.task_reward)
        cols["length_penalties"].append(r.length_penalty)
        cols["rewards"].append(r.total)
    g = s.cfg.sampling.group_size
    cols["advantages"] = np.concatenate(
        [group_advantages(cols["rewards"][i : i + g]) for i in range(0, len(cols["rewards"]), g)]
    ).tolist()
    return cols


def prove_by_prefill(s: Swarm, cols: dict) -> dict:
    """Rebuild proofs and logprobs by prefilling the claimed model on the (altered) text."""
    stats = recompute(
        s.model,
        cols["input_tokens"],
        cols["output_tokens"],
        temperature=s.params.temperature,
        top_p=s.params.top_p,
        eos_id=s.tok.eos_token_id,
    )
    cols["proofs"] = [proofs_to_bytes(build_proofs(st.hidden)) for st in stats]
    cols["output_logprobs"] = [st.logprobs.astype(np.float32).tolist() for st in stats]
    return cols


def resample_group(s: Swarm, cols: dict, group: int, prompt_ids: list[int], model=None) -> dict:
    """Replace one group's samples with honest samples (of `model`) for another prompt."""
    g = s.cfg.sampling.group_size
    rows = range(group * g, (group + 1) * g)
    gens = sample(
        model or s.model,
        [prompt_ids] * g,
        [cols["seed"][i] for i in rows],
        s.params,
        pad_id=s.tok.pad_token_id,
    )
    for i, gen in zip(rows, gens, strict=True):
        cols["input_tokens"][i] = prompt_ids
        cols["output_tokens"][i] = gen.tokens
        cols["output_logprobs"][i] = gen.logprobs.tolist()
        cols["proofs"][i] = proofs_to_bytes(build_proofs(gen.hidden))
    return cols


def assert_rejected(verdict, check: str) -> None:
    assert verdict.status == "rejected", verdict.reason
    assert check in verdict.failed_checks, verdict.reason
    assert verdict.reason.startswith("rejected: ")


@pytest.fixture(scope="module")
def honest(swarm) -> tuple[Path, dict]:
    cols = honest_columns(swarm, 0)
    return write(swarm, 0, cols), cols


def copy_cols(cols: dict) -> dict:
    return {k: list(v) for k, v in cols.items()}


@pytest.mark.slow
def test_honest_file_is_accepted_by_the_real_command(swarm, honest):
    path, _ = honest
    out = subprocess.run(
        [sys.executable, "-m", "swarmrl.validator.cli", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["status"] == "accepted" and verdict["failed_checks"] == []


@pytest.mark.slow
def test_other_weights_than_claimed(swarm):
    cheat_model, _ = load_policy(swarm.run_dir / "checkpoints" / "step_000000")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in cheat_model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2 * p.std().clamp(min=1e-3))
    cols = generate_rollouts(
        cheat_model,
        swarm.tok,
        swarm.task,
        assignment(swarm, 1),
        swarm.params,
        STEP,
        swarm.cfg.task.length_alpha,
    ).columns
    path = write(swarm, 1, cols)
    out = subprocess.run(
        [sys.executable, "-m", "swarmrl.validator.cli", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("\n") == 1 and ": rejected: " in out.stdout and "toploc" in out.stdout
    assert {"toploc", "logprobs", "sampling"} <= set(judge(swarm, path).failed_checks)


def test_altered_prompt(swarm, honest):
    cols = copy_cols(honest[1])
    altered = list(cols["input_tokens"][0])
    digit = next(i for i, t in enumerate(altered) if swarm.tok.decode([t]).isdigit() and i > 8)
    altered[digit] = swarm.tok.convert_tokens_to_ids(
        "9" if swarm.tok.decode([altered[digit]]) != "9" else "8"
    )
    cols = rescore(swarm, resample_group(swarm, cols, 0, altered))
    verdict = judge(swarm, write(swarm, 0, cols, "altered.parquet"))
    assert_rejected(verdict, "assignment")
    assert verdict.failures[0].sample == 0 and "prompt tokens" in verdict.reason


def test_cherry_picked_prompts(swarm, honest):
    cols = copy_cols(honest[1])
    easy = swarm.task.train_problem(
        5
    )  # a problem of the worker's choosing instead of the assigned one
    target = cols["target_lengths"][8]
    ids = swarm.tok(swarm.task.render_prompt(easy, target))["input_ids"]
    cols = resample_group(swarm, cols, 1, ids)
    cols["problem_id"][8:16] = [easy.problem_id] * 8
    cols = rescore(swarm, cols)
    verdict = judge(swarm, write(swarm, 0, cols, "cherry.parquet"))
    assert_rejected(verdict, "assignment")
    assert verdict.failures[0].sample == 8 and easy.problem_id in verdict.reason


def test_smaller_models_text_prefilled_into_the_claimed_model(swarm, honest):
    small = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=swarm.model.config.vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
            eos_token_id=swarm.tok.eos_token_id,
        )
    )
    torch.manual_seed(3)
    small.eval()
    cols = copy_cols(honest[1])
    gens = sample(
        small, cols["input_tokens"], cols["seed"], swarm.params, pad_id=swarm.tok.pad_token_id
    )
    cols["output_tokens"] = [g.tokens for g in gens]
    cols = rescore(swarm, prove_by_prefill(swarm, cols))
    verdict = judge(swarm, write(swarm, 0, cols, "small.parquet"))
    assert_rejected(verdict, "sampling")
    assert "toploc" not in verdict.failed_checks and "logprobs" not in verdict.failed_checks
    assert verdict.figures["sampling.surprisal_z"] > 5  # the claimed model finds the text unlikely


def test_early_stop_on_low_probability_eos(swarm, honest):
    cols = copy_cols(honest[1])
    stats = recompute(
        swarm.model,
        cols["input_tokens"],
        cols["output_tokens"],
        temperature=swarm.params.temperature,
        top_p=1.0,
        eos_id=swarm.tok.eos_token_id,
    )
    # The least probable EOS anywhere inside a sample (from its 6th token): the worker
    # stops there, where the claimed model would almost surely have gone on.
    victim, cut = min(
        (
            (i, int(np.argmin(st.eos_probs[5:-1])) + 5)
            for i, st in enumerate(stats)
            if len(st.eos_probs) > 6
        ),
        key=lambda at: stats[at[0]].eos_probs[at[1]],
    )
    assert stats[victim].eos_probs[cut] < ValidatorSettings().min_eos_prob / 2
    cols["output_tokens"][victim] = [*cols["output_tokens"][victim][:cut], swarm.tok.eos_token_id]
    cols = rescore(swarm, prove_by_prefill(swarm, cols))
    verdict = judge(swarm, write(swarm, 0, cols, "early.parquet"))
    assert_rejected(verdict, "termination")
    assert verdict.failures[0].sample == victim and "EOS of probability" in verdict.reason


@pytest.mark.parametrize("what", ["rewards", "advantages"])
def test_inflated_rewards_or_advantages(swarm, honest, what):
    cols = copy_cols(honest[1])
    if what == "rewards":
        cols["task_rewards"][3] = 1.0 if cols["task_rewards"][3] == 0.0 else cols["task_rewards"][3]
        cols["rewards"][3] = cols["task_rewards"][3] - cols["length_penalties"][3] + 0.5
        cols["advantages"][0:8] = group_advantages(cols["rewards"][0:8]).tolist()
    else:
        cols["advantages"][3] += 1.0
    verdict = judge(swarm, write(swarm, 0, cols, f"inflated-{what}.parquet"))
    assert_rejected(verdict, "values")
    assert verdict.failed_checks == ["values"] and any(f.sample == 3 for f in verdict.failures)


def _same_chunk_pair(cols: dict) -> tuple[int, int]:
    by_len: dict[int, int] = {}
    for i, p in enumerate(cols["proofs"]):
        if len(p) in by_len and cols["output_tokens"][i] != cols["output_tokens"][by_len[len(p)]]:
            return by_len[len(p)], i
        by_len.setdefault(len(p), i)
    raise AssertionError("no two samples with the same number of proof chunks")


@pytest.mark.parametrize("how", ["copied", "swapped", "chunks-reordered"])
def test_proofs_copied_or_reordered_between_samples(swarm, honest, how):
    cols = copy_cols(honest[1])
    a, b = _same_chunk_pair(cols)
    if how == "copied":
        cols["proofs"][b] = cols["proofs"][a]
    elif how == "swapped":
        cols["proofs"][a], cols["proofs"][b] = cols["proofs"][b], cols["proofs"][a]
    else:
        b = next(i for i, p in enumerate(cols["proofs"]) if len(p) == 2 * 258)
        cols["proofs"][b] = cols["proofs"][b][258:] + cols["proofs"][b][:258]
    verdict = judge(swarm, write(swarm, 0, cols, f"proofs-{how}.parquet"))
    assert_rejected(verdict, "toploc")
    assert verdict.failed_checks == ["toploc"]
    failing = {f.sample for f in verdict.failures}
    assert b in failing and (how != "swapped" or a in failing)


def test_truncated_sample_with_truncated_proofs(swarm, honest):
    cols = copy_cols(honest[1])
    i = next(i for i, out in enumerate(cols["output_tokens"]) if len(out) > 34)
    cols["output_tokens"][i] = cols["output_tokens"][i][:32]
    cols["output_logprobs"][i] = cols["output_logprobs"][i][:32]
    cols["proofs"][i] = cols["proofs"][i][:258]
    cols = rescore(swarm, cols)
    verdict = judge(swarm, write(swarm, 0, cols, "truncated-sample.parquet"))
    assert_rejected(verdict, "termination")
    assert verdict.failures[0].sample == i and "without EOS" in verdict.reason


def test_random_proof_bytes(swarm, honest):
    cols = copy_cols(honest[1])
    rng = np.random.default_rng(0)
    cols["proofs"][5] = b"".join(
        encode_proof(65497, rng.integers(0, 65497, 128))
        for _ in range(len(cols["proofs"][5]) // 258)
    )
    verdict = judge(swarm, write(swarm, 0, cols, "random-proofs.parquet"))
    assert_rejected(verdict, "toploc")
    assert verdict.failures[0].sample == 5 and verdict.reason.startswith(
        "rejected: toploc: sample 5: chunk 0"
    )


def claimed(s: Swarm) -> list[str]:
    """`swarmrl validate` flags naming the swarm's config and checkpoint."""
    return [
        "--config",
        str(s.run_dir / "config.json"),
        "--model",
        str(s.run_dir / "checkpoints" / "step_000000"),
    ]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    validator_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("damage", ["truncated-proofs", "two-byte-proof", "null-proof"])
def test_malformed_proofs_are_unusable_input(swarm, honest, capsys, damage, tmp_path):
    cols = copy_cols(honest[1])
    if damage == "truncated-proofs":
        cols["proofs"][2] = cols["proofs"][2][:-100]
    elif damage == "two-byte-proof":
        cols["proofs"][2] = b"\xff\xd9"
    else:
        cols["proofs"][2] = b"\x00\x00" + cols["proofs"][2][2:]
    path = write(swarm, 0, cols, f"malformed-{damage}.parquet", run_dir=tmp_path)
    code, out, err = run_cli(["validate", str(path), *claimed(swarm)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unusable: malformed proofs in sample 2" in err


@pytest.mark.slow
def test_truncated_file_and_wrong_schema_are_unusable_by_the_real_command(swarm, honest, tmp_path):
    path, cols = honest
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    out = subprocess.run(
        [sys.executable, "-m", "swarmrl.validator.cli", str(truncated)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "unusable: unreadable rollout file" in out.stderr

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    wrong = table.set_column(
        table.schema.get_field_index("seed"),
        pa.field("seed", pa.string()),
        pa.array([str(x) for x in cols["seed"]]),
    )
    bad = tmp_path / "wrong-schema.parquet"
    pq.write_table(wrong, bad)
    verdict = validate_file(
        bad,
        config_path=swarm.run_dir / "config.json",
        model_dir=swarm.run_dir / "checkpoints" / "step_000000",
    )
    assert (
        verdict.status == "unusable"
        and verdict.exit_code == 2
        and "'seed' has type string" in verdict.reason
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # minutes on a busy machine
def test_honest_workers_are_never_rejected(swarm):
    """2,048 honest samples: different batch sizes (64 to 1,024), thread counts and batch mixes,
    each file judged by a validator on the other thread count than its worker's (1 vs 2)."""
    g = swarm.cfg.sampling.group_size
    per_file = swarm.cfg.worker.prompts_per_file
    plans = [
        (1, 1),
        (1, 1),
        (2, 2),
        (4, 1),
        (8, 2),
        (16, 2),
        (32, 1),
    ]  # (files generated in one batch, threads)
    counter, verdicts = 100, []
    try:
        for files, threads in plans:
            torch.set_num_threads(threads)
            plans_ = [assignment(swarm, counter + k) for k in range(files)]
            merged = Assignment(
                seed=0,
                problem_indices=functools.reduce(
                    operator.iadd, (p.problem_indices for p in plans_), []
                ),
                target_lengths=functools.reduce(
                    operator.iadd, (p.target_lengths for p in plans_), []
                ),
                sample_seeds=functools.reduce(operator.iadd, (p.sample_seeds for p in plans_), []),
            )
            cols = generate_rollouts(
                swarm.model,
                swarm.tok,
                swarm.task,
                merged,
                swarm.params,
                STEP,
                swarm.cfg.task.length_alpha,
            ).columns
            rows = per_file * g
            for k in range(files):
                part = {name: values[k * rows : (k + 1) * rows] for name, values in cols.items()}
                torch.set_num_threads(3 - threads)  # the validator on the other thread count
                verdicts.append(judge(swarm, write(swarm, counter + k, part)))
                torch.set_num_threads(threads)
            counter += files
    finally:
        torch.set_num_threads(1)
    samples = sum(v.figures["samples"] for v in verdicts)
    assert samples >= 2048
    rejected = [v.reason for v in verdicts if v.status != "accepted"]
    assert rejected == []
    worst = {
        key: max(v.figures[key] for v in verdicts)
        for key in (
            "toploc.max_exp_mismatches",
            "toploc.max_mant_err_mean",
            "logprobs.max_abs_diff",
            "sampling.max_replay_excess",
        )
    }
    z = [v.figures["sampling.surprisal_z"] for v in verdicts]
    print(
        f"honest calibration over {samples} samples: {worst}, surprisal z in [{min(z):.2f}, {max(z):.2f}], "
        f"min PIT p {min(v.figures['sampling.pit_p'] for v in verdicts):.3g}, "
        f"low-probability EOS endings {sum(v.figures['termination.low_probability_eos'] for v in verdicts)}"
    )
