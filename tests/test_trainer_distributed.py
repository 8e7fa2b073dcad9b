"""The sharded trainer (FSDP2 on gloo, real processes) gives one process's update.

N ranks x M micro-batches must match one process on the whole minibatch (loss, gradient
norm, updated parameters within 1e-5 relative), because the loss is normalized by the
global token budget; a per-rank normalization must not. The resumable state saved at 2
ranks resumes elsewhere, and a 2-rank trainer killed with SIGKILL resumes to the same
parameters as a run that was never interrupted.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from helpers import built_once
from swarmrl.checkpoints import load_policy
from swarmrl.identity import Identity
from swarmrl.orchestrator import OrchestratorConfig, OrchestratorThread
from swarmrl.protocol import PoolClient
from swarmrl.rollouts import COLUMNS, RolloutMeta, write_rollouts
from swarmrl.runfolder import checkpoint_dir, list_checkpoints
from swarmrl.trainer import distributed, update
from swarmrl.trainer.batches import Sample, token_samples
from swarmrl.trainer.distributed import Ranks
from swarmrl.trainer.state import load_trainer_state, save_trainer_state
from swarmrl.trainer.update import UpdateSettings, micro_batches, rollout_update

SETTINGS = UpdateSettings(
    temperature=0.6,
    max_new_tokens=12,
    epsilon=0.2,
    delta=4.0,
    entropy_coef=0.01,
    grad_clip=1.0,
    micro_batch_samples=None,
)
# 14 samples in 2 minibatches of 7: 2 ranks get shares of 4 and 3 (uneven on purpose, so
# a per-rank normalization cannot agree by accident), 2-sample micro-batches give a rank
# 2 and 1 or 2 and an empty one, and one rank in 2-sample micro-batches runs 4 of them.
MINIBATCHES = [[0, 2, 4, 6, 8, 10, 12], [1, 3, 5, 7, 9, 11, 13]]
LR = 1e-3


def _samples(vocab: int, n: int = 14, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    prompts, completions, advantages = [], [], []
    for _ in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))]
        completion = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 12))]
        advantage = rng.choice([-1.0, 1.0]) * rng.uniform(0.3, 1.5)
        prompts.append(prompt)
        completions.append(completion)
        advantages.append(advantage)
    return token_samples(prompts, completions, advantages)


def _update(
    model_dir: Path,
    ranks: Ranks,
    micro: int | None,
    state_dir: Path | None = None,
    precision: str = "fp32",
):
    """One rollout update from the saved weights; (stats, full weights) on rank 0."""
    torch.manual_seed(0)
    model, tok = load_policy(model_dir)
    model = distributed.prepare_model(model, ranks, False, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.01)
    settings = UpdateSettings(
        **{
            **SETTINGS.__dict__,
            "micro_batch_samples": micro,
            # as the trainer sets it: one process computes bf16 under autocast
            "autocast_bf16": precision == "bf16" and not ranks.sharded,
        }
    )
    samples = _samples(len(tok))
    stats = rollout_update(
        model, opt, samples, MINIBATCHES, [LR, LR], settings, ranks, tok.pad_token_id
    )
    weights = distributed.full_state_dict(model, ranks)
    if state_dir is not None:
        save_trainer_state(state_dir, model, opt, {"optimizer_steps": 2}, ranks)
        # One more update from the same state: what a resumed trainer must reproduce.
        rollout_update(
            model, opt, samples, MINIBATCHES, [LR, LR], settings, ranks, tok.pad_token_id
        )
        return stats, weights, distributed.full_state_dict(model, ranks)
    return stats, weights, None


def _rank_main(rank: int, world: int, port: int, model_dir: str, out: str, runs: list) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    ranks = distributed.join()
    for name, micro, mutant, precision in runs:
        if mutant:
            # Per-rank normalization, ranks averaged (what plain data parallelism does):
            # each rank divides by its own share's budget, and the sum is over W ranks.
            def per_rank_budget(n: int, max_new_tokens: int) -> float:
                share = len(range(rank, n, world))
                return float(share * max_new_tokens * world)

            update.token_budget = per_rank_budget
        state_dir = Path(out) / f"{name}-state" if name == "2x1" else None
        stats, weights, after = _update(Path(model_dir), ranks, micro, state_dir, precision)
        if ranks.is_main:
            torch.save({"stats": stats, "weights": weights, "after": after}, Path(out) / name)
    distributed.leave(ranks)
    distributed.exit_rank(0)  # not through the interpreter's shutdown


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _weights_rel_diff(a: dict, b: dict) -> float:
    """|a - b| / |b| over the whole model. Not per tensor: the attention key biases have no
    gradient in exact arithmetic (softmax ignores a constant shift), so Adam turns their
    rounding noise into full-size steps of either sign on those zero-initialized tensors."""
    assert a.keys() == b.keys()
    diff = sum(float((a[k] - b[k]).double().pow(2).sum()) for k in a)
    norm = sum(float(b[k].double().pow(2).sum()) for k in a)
    return math.sqrt(diff / norm)


def _agrees(run: dict, ref: dict) -> bool:
    stats, ref_stats = run["stats"], ref["stats"]
    return (
        _close(stats.loss, ref_stats.loss)
        and _close(stats.grad_norm, ref_stats.grad_norm)
        and _close(stats.grad_norm_max, ref_stats.grad_norm_max)
        and _weights_rel_diff(run["weights"], ref["weights"]) <= 1e-5
    )


def _save_model(folder: Path) -> None:
    from helpers import random_model

    model, tok = random_model("qwen2", hidden=64, layers=2, seed=3)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """One model for the whole run: the 2-rank runs, built once, start from its files."""
    return built_once(tmp_path_factory, "qwen2-model", _save_model)


@pytest.fixture(scope="module")
def reference(model_dir) -> dict:
    stats, weights, _ = _update(model_dir, Ranks(), None)
    return {"stats": stats, "weights": weights}


@pytest.fixture(scope="module")
def two_ranks(model_dir, tmp_path_factory) -> Path:
    """All 2-rank runs in one pair of real processes (gloo over loopback), once per test
    run: the xdist workers that run its tests share them."""
    runs = [
        ("2x1", None, False, "fp32"),
        ("2x2", 2, False, "fp32"),
        ("bf16", 2, False, "bf16"),
        ("mutant", None, True, "fp32"),
    ]

    def start(out: Path) -> None:
        mp.start_processes(
            _rank_main,
            args=(2, _free_port(), str(model_dir), str(out), runs),
            nprocs=2,
            start_method="spawn",
        )

    return built_once(tmp_path_factory, "two-ranks", start)


def test_micro_batches_cover_each_sample_once_with_equal_counts_per_rank():
    for n in range(1, 12):
        mb = list(range(100, 100 + n))
        for world in (1, 2, 3):
            for size in (None, 1, 2, 3):
                plans = [micro_batches(mb, Ranks(rank=r, world=world), size) for r in range(world)]
                assert len({len(p) for p in plans}) == 1  # collectives stay in step
                dealt = sorted(i for plan in plans for micro in plan for i in micro)
                assert dealt == mb
                assert all(len(micro) <= (size or math.ceil(n / world)) for micro in plans[0])


def test_one_rank_four_micro_batches_matches_one_pass(model_dir, reference):
    assert len(micro_batches(MINIBATCHES[0], Ranks(), 2)) == 4
    stats, weights, _ = _update(model_dir, Ranks(), 2)
    assert _agrees({"stats": stats, "weights": weights}, reference)
    assert stats.trained_tokens == reference["stats"].trained_tokens


@pytest.mark.slow
def test_two_ranks_match_one_process(two_ranks, reference):
    for name in ("2x1", "2x2"):
        run = torch.load(two_ranks / name, weights_only=False)
        assert _agrees(run, reference), (name, run["stats"], reference["stats"])
        assert run["stats"].trained_tokens == reference["stats"].trained_tokens
        assert _close(run["stats"].entropy, reference["stats"].entropy)


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_master_weights_close_to_fp32(two_ranks, reference, model_dir):
    run = torch.load(two_ranks / "bf16", weights_only=False)
    assert all(w.dtype == torch.float32 for w in run["weights"].values())
    assert _close(run["stats"].loss, reference["stats"].loss, rel=0.05)
    assert _close(run["stats"].grad_norm, reference["stats"].grad_norm, rel=0.05)
    # The fp32 master weights took about the fp32 update (bf16 rounding flips a few
    # small gradients' signs, which Adam turns into full steps).
    start = load_policy(model_dir)[0].state_dict()
    step_bf16 = {k: run["weights"][k] - start[k] for k in start}
    step_fp32 = {k: reference["weights"][k] - start[k] for k in start}
    assert _weights_rel_diff(step_bf16, step_fp32) < 0.25


def test_auto_precision_is_bf16_only_where_the_device_computes_it_natively():
    assert distributed.compute_precision("auto", True) == "bf16"
    assert distributed.compute_precision("auto", False) == "fp32"
    for asked in ("fp32", "bf16"):
        assert distributed.compute_precision(asked, True) == asked
        assert distributed.compute_precision(asked, False) == asked
    with pytest.raises(ValueError, match="fp16"):
        distributed.compute_precision("fp16", True)
    assert distributed.native_bf16(torch.device("meta")) is False
    assert isinstance(distributed.native_bf16(torch.device("cpu")), bool)


def test_one_process_bf16_autocast_keeps_fp32_weights_close_to_fp32(model_dir, reference):
    stats, weights, _ = _update(model_dir, Ranks(), None, precision="bf16")
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert _close(stats.loss, reference["stats"].loss, rel=0.05)
    assert _close(stats.grad_norm, reference["stats"].grad_norm, rel=0.05)
    start = load_policy(model_dir)[0].state_dict()
    step_bf16 = {k: weights[k] - start[k] for k in start}
    step_fp32 = {k: reference["weights"][k] - start[k] for k in start}
    # bf16 products moved the update (so autocast ran), but not far from the fp32 one
    assert 0 < _weights_rel_diff(step_bf16, step_fp32) < 0.25
    assert stats.loss != reference["stats"].loss


@pytest.mark.slow
def test_per_rank_normalization_does_not_match(two_ranks, reference):
    run = torch.load(two_ranks / "mutant", weights_only=False)
    assert not _agrees(run, reference)
    assert _weights_rel_diff(run["weights"], reference["weights"]) > 1e-5


@pytest.mark.slow
def test_state_saved_at_two_ranks_resumes_in_one_process(two_ranks, model_dir):
    saved = torch.load(two_ranks / "2x1", weights_only=False)
    model, tok = load_policy(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.01)
    progress = load_trainer_state(two_ranks / "2x1-state", model, opt, Ranks())
    assert progress["optimizer_steps"] == 2
    assert _weights_rel_diff(model.state_dict(), saved["weights"]) == 0
    rollout_update(
        model, opt, _samples(len(tok)), MINIBATCHES, [LR, LR], SETTINGS, Ranks(), tok.pad_token_id
    )
    assert _weights_rel_diff(model.state_dict(), saved["after"]) <= 1e-5


class _Feeder(threading.Thread):
    """A worker in the test process: takes every assignment the orchestrator issues and
    uploads a file whose completions are right for half of each group (signal the
    trainer's own verifier finds). The same secret and the same order of requests give
    two pools the same assignments, so two runs train on the same files."""

    def __init__(self, url: str, model_dir: Path) -> None:
        super().__init__(daemon=True)
        from swarmrl.config import load_config
        from swarmrl.tasks.registry import build_task

        self.client = PoolClient(url, Identity.generate())
        self.client.register("worker")
        _, self.tok = load_policy(model_dir)
        self.cfg = load_config(None, {"worker.prompts_per_file": 2, "sampling.group_size": 4})
        self.task = build_task(self.cfg.task)
        self.stop = threading.Event()
        self.tmp = Path(tempfile.mkdtemp(prefix="swarmrl-feeder-"))

    def run(self) -> None:
        while not self.stop.is_set():
            view = self.client.heartbeat()
            if view.finished:
                return
            policy = view.checkpoint.step if view.checkpoint else 0
            a = self.client.assignment(policy).assignment
            if a is None:
                self.stop.wait(0.1)
                continue
            self.client.upload(a.id, self._file(a))

    def _file(self, a) -> Path:
        from swarmrl.assignment import assign_from_seed
        from swarmrl.generation.rollout import prompt_ids
        from swarmrl.rewards import group_advantages, has_signal, score_sample

        plan = assign_from_seed(
            a.seed,
            num_problems=self.task.num_train(),
            prompts=a.prompts,
            group_size=a.group_size,
            target_lengths=self.cfg.task.target_lengths,
        )
        cols: dict[str, list] = {k: [] for k in COLUMNS}
        for index, target, seeds in zip(
            plan.problem_indices, plan.target_lengths, plan.sample_seeds, strict=True
        ):
            problem = self.task.train_problem(index)
            ids = prompt_ids(self.tok, self.task, problem, target)
            totals = []
            for j, seed in enumerate(seeds):
                text = f";={problem.answer}" if j % 2 == 0 else ";=0"
                out = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
                reward = score_sample(
                    float(j % 2 == 0), target, len(out), self.cfg.task.length_alpha
                )
                totals.append(reward.total)
                for name, value in (
                    ("problem_id", problem.problem_id),
                    ("input_tokens", ids),
                    ("output_tokens", out),
                    ("output_logprobs", [-1.0] * len(out)),
                    ("rewards", reward.total),
                    ("task_rewards", reward.task_reward),
                    ("length_penalties", reward.length_penalty),
                    ("target_lengths", target),
                    ("policy_step", max(0, a.step - 1)),
                    ("seed", seed),
                    ("proofs", b""),
                ):
                    cols[name].append(value)
            assert has_signal(totals)
            cols["advantages"].extend(group_advantages(totals).tolist())
        n = len(cols["rewards"])
        meta = RolloutMeta(
            run_id="r",
            worker_address=self.client.address,
            step=a.step,
            submission=a.id,
            num_samples=n,
            num_nonzero=n,
        )
        return write_rollouts(self.tmp / f"{a.id}.parquet", cols, meta)


class _Pool:
    """An orchestrator for one trainer run, with the trainer's key and a feeding worker."""

    def __init__(self, root: Path, model_dir: Path, steps: int, secret: Path | None) -> None:
        from swarmrl.identity import generate_key_file

        root.mkdir(parents=True, exist_ok=True)
        self.key = root / "trainer.key"
        trainer = generate_key_file(self.key)
        (root / "allowlist").write_text(f"{trainer.address} trainer\n")
        if secret is not None:
            shutil.copyfile(secret, root / "secret")
        self.secret = root / "secret"
        self.server = OrchestratorThread(
            OrchestratorConfig(
                ledger=f"sqlite:///{root / 'ledger.db'}",
                store=str(root / "store"),
                secret_file=str(self.secret),
                allowlist=str(root / "allowlist"),
                run_id="r",
                steps=steps,
                batch_samples=16,
                prompts_per_assignment=2,
                group_size=4,
                async_level=1,
                max_new_tokens=8,  # the trainer's sampling.max_new_tokens (_trainer_argv)
                max_open_per_worker=4,
                heartbeat_seconds=120.0,
                validation_fraction=0.0,  # no validator here: a chosen file would wait forever
            )
        )
        self.server.start()
        self.feeder = _Feeder(self.server.url, model_dir)
        self.feeder.start()

    def stop(self) -> None:
        self.feeder.stop.set()
        self.feeder.join(timeout=30)
        self.server.stop()


def _problems(log: str) -> str:
    """The ranks' error lines, without torchrun's and the libraries' warnings."""
    keep = [x for x in log.splitlines() if x.startswith("[rank") or "Error" in x]
    return "\n".join(keep[-60:]) or log[-3000:]


def _trainer_argv(model_dir: Path, out: Path, steps: int, pool: _Pool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "swarmrl",
        "trainer",
        "--start-model",
        str(model_dir),
        "--orchestrator",
        pool.server.url,
        "--key",
        str(pool.key),
        "--origin-url",
        "http://127.0.0.1:9",
        "--output_dir",
        str(out),
        "--run_name",
        "r",
        "--trainer.steps",
        str(steps),
        "--trainer.ranks",
        "2",
        "--trainer.batch_samples",
        "16",
        "--trainer.micro_batch_samples",
        "3",
        "--worker.prompts_per_file",
        "2",
        "--sampling.group_size",
        "4",
        "--sampling.max_new_tokens",
        "8",
        "--async_level",
        "1",
    ]


@pytest.mark.slow
def test_two_rank_trainer_killed_with_sigkill_resumes_to_the_same_parameters(
    tmp_path, model_dir, request
):
    steps = 6
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # Two pools with one secret: the same assignments, so the same files, in both runs.
    pools = {"straight": _Pool(tmp_path / "pool-straight", model_dir, steps, None)}
    pools["killed"] = _Pool(tmp_path / "pool-killed", model_dir, steps, pools["straight"].secret)
    request.addfinalizer(lambda: [p.stop() for p in pools.values()])
    straight = subprocess.run(
        _trainer_argv(model_dir, tmp_path / "straight", steps, pools["straight"]),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert straight.returncode == 0, _problems(straight.stderr)

    ckpts = tmp_path / "killed" / "r" / "checkpoints"
    log = tmp_path / "killed.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            _trainer_argv(model_dir, tmp_path / "killed", steps, pools["killed"]),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 300
        while max(list_checkpoints(ckpts), default=0) < 2:
            assert time.time() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1.0)  # the ranks die with their launcher (PR_SET_PDEATHSIG)
    reached = max(list_checkpoints(ckpts))
    assert reached < steps
    assert max(list_checkpoints(ckpts)) == reached  # nothing kept training after the kill

    resumed = subprocess.run(
        _trainer_argv(model_dir, tmp_path / "killed", steps, pools["killed"]),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert resumed.returncode == 0, _problems(resumed.stderr)
    printed = [json.loads(x)["step"] for x in resumed.stdout.splitlines() if x.startswith("{")]
    assert printed == list(range(reached, steps))
    final = {
        name: load_file(
            checkpoint_dir(tmp_path / name / "r" / "checkpoints", steps) / "model.safetensors"
        )
        for name in ("straight", "killed")
    }
    assert final["straight"].keys() == final["killed"].keys()
    for key, tensor in final["straight"].items():
        assert torch.equal(tensor, final["killed"][key]), key
