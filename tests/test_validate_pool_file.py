"""`swarmrl validate` on a file of a real pool: the assignment's seed comes from the
orchestrator's secret, so the command asks the orchestrator for it (`--orchestrator URL
--key FILE`, a validator's or the trainer's key); without it, the command says that the
assignment cannot be checked instead of rejecting every pool file."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from helpers import random_model
from pool_fixtures import orchestrator_process
from swarmrl.assignment import assign_from_seed
from swarmrl.checkpoints import load_policy
from swarmrl.config import load_config
from swarmrl.generation.rollout import generate_rollouts
from swarmrl.generation.sampler import SamplingParams
from swarmrl.identity import Identity, generate_key_file
from swarmrl.protocol import PoolClient
from swarmrl.rollouts import RolloutMeta, write_rollouts
from swarmrl.tasks.registry import build_task
from swarmrl.validator import Status, validate_file
from swarmrl.validator import cli as validator_cli

RUN = "pool-run"
PROMPTS, GROUP = 2, 4


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    validator_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """An orchestrator process on loopback with a trainer, a validator and a worker whose two
    uploaded files answer two issued assignments: one honest, one holding the first
    assignment's rows again (prompts and seeds the orchestrator did not issue for it)."""
    tmp = tmp_path_factory.mktemp("pool")
    model, tok = random_model("llama", hidden=32, layers=1)
    model_dir = tmp / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load_config(
        None,
        {
            "run_name": RUN,
            "output_dir": str(tmp / "runs"),
            "worker.prompts_per_file": PROMPTS,
            "sampling.group_size": GROUP,
        },
    )
    config_path = tmp / "config.json"
    config_path.write_text(cfg.model_dump_json())
    trainer = generate_key_file(tmp / "trainer.key")
    validator = generate_key_file(tmp / "validator.key")
    generate_key_file(tmp / "worker.key")
    (tmp / "allowlist").write_text(f"{trainer.address} trainer\n{validator.address} validator\n")
    proc, url = orchestrator_process(
        tmp,
        "--run-id",
        RUN,
        "--allowlist",
        str(tmp / "allowlist"),
        "--prompts-per-assignment",
        str(PROMPTS),
        "--group-size",
        str(GROUP),
        "--batch-samples",
        str(4 * PROMPTS * GROUP),
    )
    try:
        with PoolClient(url, trainer) as t:
            t.register("trainer")
            t.announce_checkpoint(0, "0" * 64)
        worker = PoolClient(url, Identity.generate())
        worker.register("worker")
        issued = [worker.assignment(0).assignment for _ in range(2)]
        assert all(a is not None for a in issued)
        policy, tok = load_policy(model_dir)
        task = build_task(cfg.task)
        params = SamplingParams(
            temperature=cfg.sampling.temperature,
            max_new_tokens=cfg.sampling.max_new_tokens,
            eos_token_id=tok.eos_token_id,
            top_p=cfg.sampling.top_p,
        )
        rows = generate_rollouts(
            policy,
            tok,
            task,
            assign_from_seed(
                issued[0].seed,
                num_problems=task.num_train(),
                prompts=PROMPTS,
                group_size=GROUP,
                target_lengths=cfg.task.target_lengths,
            ),
            params,
            0,
            cfg.task.length_alpha,
        )
        files = {}
        for name, a in zip(["honest", "reused"], issued, strict=True):
            meta = RolloutMeta(
                run_id=RUN,
                worker_address=worker.address,
                step=a.step,
                submission=a.id,
                num_samples=PROMPTS * GROUP,
                num_nonzero=rows.num_nonzero,
            )
            # Each file alone in its folder: `validate` compares a file with its folder's
            # earlier files, and the reused one is a duplicate of nothing the pool holds.
            path = write_rollouts(tmp / name / "file.parquet", rows.columns, meta)
            worker.upload(a.id, path)
            files[name] = path
        worker.close()
        yield {
            "url": url,
            "tmp": tmp,
            "files": files,
            "common": ["--model", str(model_dir), "--config", str(config_path)],
            "model_dir": model_dir,
            "config": config_path,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_the_real_command_accepts_an_honest_pool_file_with_the_orchestrators_seed(pool):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmrl",
            "validate",
            str(pool["files"]["honest"]),
            *pool["common"],
            "--orchestrator",
            pool["url"],
            "--key",
            str(pool["tmp"] / "validator.key"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["status"] == "accepted" and verdict["failed_checks"] == [], verdict


def test_without_the_orchestrator_the_assignment_cannot_be_checked(pool, capsys):
    path = pool["files"]["honest"]
    # What `validate` answered before: the offline derivation of the seed, a reject of an
    # honest file at `assignment`.
    offline = validate_file(path, model_dir=pool["model_dir"], config_path=pool["config"])
    assert offline.status == Status.REJECTED and offline.failed_checks == ["assignment"]
    code, out, err = run_cli(["validate", str(path), *pool["common"]], capsys)
    assert (code, out) == (2, ""), out + err
    assert err.count("\n") == 1 and err.startswith(f"{path}: unusable: "), err
    assert "the assignment cannot be checked without the orchestrator" in err
    assert "--orchestrator URL --key FILE" in err


def test_with_the_orchestrator_a_file_reusing_another_assignments_rows_is_rejected(pool, capsys):
    key = pool["tmp"] / "validator.key"
    argv = [*pool["common"], "--orchestrator", pool["url"], "--key", str(key)]
    code, out, err = run_cli(["validate", str(pool["files"]["reused"]), *argv], capsys)
    assert code == 1 and err == "", err
    assert ": rejected: assignment: sample 0: " in out, out


def test_the_orchestrator_answers_only_validator_and_trainer_keys_and_known_files(pool, capsys):
    path = pool["files"]["honest"]
    for role in ("trainer", "validator"):
        argv = [*pool["common"], "--orchestrator", pool["url"], "--key"]
        code, out, err = run_cli(
            ["validate", str(path), *argv, str(pool["tmp"] / f"{role}.key")], capsys
        )
        assert code == 0 and ": accepted: " in out, out + err
    code, out, err = run_cli(
        [
            "validate",
            str(path),
            *pool["common"],
            "--orchestrator",
            pool["url"],
            "--key",
            str(pool["tmp"] / "worker.key"),
        ],
        capsys,
    )
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert "not on the allowlist as a validator or trainer" in err
    # Bytes the pool never received: another file, or the uploaded one altered.
    altered = pool["tmp"] / "altered" / "file.parquet"
    altered.parent.mkdir()
    altered.write_bytes(path.read_bytes() + b"\0")
    code, out, err = run_cli(
        [
            "validate",
            str(altered),
            *pool["common"],
            "--orchestrator",
            pool["url"],
            "--key",
            str(pool["tmp"] / "validator.key"),
        ],
        capsys,
    )
    assert (code, out) == (2, "") and "has no submission with this file's SHA-256" in err, err
    code, _, err = run_cli(
        ["validate", str(path), *pool["common"], "--orchestrator", pool["url"]], capsys
    )
    assert code == 2 and "--orchestrator and --key go together" in err
