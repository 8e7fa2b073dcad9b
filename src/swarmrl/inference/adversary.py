"""Cheating workers, to see the pool's defences work (`swarmrl worker --adversary KIND`,
`swarmrl run --adversary KIND[,KIND...]`).

Each kind is one small change to the honest worker, at one of four points of its loop:
the policy it loads, the sampling parameters, the generation of an assignment, or the
rollout file once written (before the upload). Everything else (registration,
heartbeats, assignments, TOPLOC proofs, uploads) is the honest worker's code, so a
cheater looks like any other member until a check catches it.

| kind | what it does | what catches it |
| --- | --- | --- |
| `wrong_model` | generates with a 4-bit-quantized copy of the policy it claims | toploc, logprobs, sampling replay |
| `temperature` | samples at half the run's temperature, claims the run's | logprobs, sampling replay |
| `best_of_n` | samples each group with N other seeds, keeps the best-rewarded, claims the assigned seeds | sampling replay |
| `inflated_rewards` | claims every answer correct and scales the advantages up | values (reward re-verified) |
| `copied_proofs` | gives samples the TOPLOC proof of another sample of the file | toploc |
| `garbage` | replaces the completions by random tokens (no model run for them) | termination, values, toploc |
| `copy` | re-uploads another worker's stored file as its own (metadata rewritten) | assignment (prompts and seeds are another assignment's) |

A `copy` cheater needs another worker's file: it reads them from a folder it is given
(`--copy-from`, e.g. a rollout store readable by workers). Re-uploading the file
unchanged is refused at upload (its metadata names the other worker and assignment, and
its hash is already stored), so the cheater rewrites the metadata to its own assignment;
the validator then finds prompts and seeds that are not the ones issued.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from swarmrl.assignment import Assignment
from swarmrl.generation.rollout import RolloutBatch
from swarmrl.generation.sampler import SamplingParams
from swarmrl.inference.kinds import KINDS
from swarmrl.rewards import group_advantages, has_signal
from swarmrl.rollouts import RolloutFileError, RolloutMeta, read_rollouts, write_rollouts

log = logging.getLogger("swarmrl.worker")

BEST_OF = 4  # groups sampled per prompt by `best_of_n`
QUANT_LEVELS = 7  # levels per sign of `wrong_model`'s per-row quantization (4 bits)
TEMPERATURE_FACTOR = 0.5  # `temperature` samples at this times the run's temperature
ADVANTAGE_FACTOR = 4.0  # `inflated_rewards` scales the advantages by this
COPY_WAIT_SECONDS = 60.0  # how long `copy` waits for a file to copy before it works honestly

Generate = Callable[..., RolloutBatch]


class Behaviour:
    """The honest worker: every hook leaves its input as it is."""

    kind = "honest"

    def policy(self, model):
        """The model the worker generates with, given the policy it loaded and claims."""
        return model

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """The sampling parameters it uses (the file claims the run's)."""
        return params

    def generate(self, generate: Generate, assignment: Assignment, **kwargs) -> RolloutBatch:
        """The assignment's rollouts, by `generate` (`generate_rollouts`)."""
        return generate(assignment=assignment, **kwargs)

    def tamper(self, path: Path, meta: RolloutMeta) -> None:
        """Change the written rollout file before it is uploaded."""


class WrongModel(Behaviour):
    kind = "wrong_model"

    def policy(self, model):
        # A cheaper model than the claimed one: each weight matrix rounded per row to 15
        # levels of its largest magnitude (4-bit quantization).
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() < 2:
                    continue
                scale = param.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / QUANT_LEVELS
                param.copy_(torch.round(param / scale) * scale)
        return model


class Temperature(Behaviour):
    kind = "temperature"

    def sampling(self, params: SamplingParams) -> SamplingParams:
        return replace(params, temperature=params.temperature * TEMPERATURE_FACTOR)


class BestOfN(Behaviour):
    kind = "best_of_n"

    def __init__(self, n: int = BEST_OF) -> None:
        self.n = n

    def generate(self, generate: Generate, assignment: Assignment, **kwargs) -> RolloutBatch:
        tries = [
            generate(
                assignment=replace(
                    assignment,
                    sample_seeds=[
                        [(s + k * 1_000_003) % (2**63 - 1) for s in group]
                        for group in assignment.sample_seeds
                    ],
                ),
                **kwargs,
            )
            for k in range(1, self.n + 1)
        ]
        group = len(assignment.sample_seeds[0])
        best = tries[0]
        columns: dict[str, list] = {name: [] for name in best.columns}
        generations = []
        for start in range(0, len(best.generations), group):
            rows = slice(start, start + group)
            chosen = max(tries, key=lambda b: sum(b.columns["rewards"][rows]))
            for name in columns:
                columns[name].extend(chosen.columns[name][rows])
            generations.extend(chosen.generations[rows])
        # The file claims the assigned seeds.
        columns["seed"] = [int(s) for g in assignment.sample_seeds for s in g]
        rewards = columns["rewards"]
        nonzero = sum(
            group for i in range(0, len(rewards), group) if has_signal(rewards[i : i + group])
        )
        return RolloutBatch(
            columns=columns,
            generations=generations,
            num_nonzero=nonzero,
            gen_seconds=sum(b.gen_seconds for b in tries),
            gen_tokens=sum(len(g.tokens) for g in generations),
            proof_seconds=0.0,
        )


def _rewrite(path: Path, change: Callable[[dict[str, list], RolloutMeta], RolloutMeta]) -> None:
    table, meta = read_rollouts(path)
    columns = table.to_pydict()
    meta = change(columns, meta)
    write_rollouts(path, columns, meta)


def _nonzero(rewards: list[float], group: int) -> int:
    return sum(group for i in range(0, len(rewards), group) if has_signal(rewards[i : i + group]))


def _group_size(columns: dict[str, list]) -> int:
    """Rows per group: the run of equal problem ids and prompts at the top of the file."""
    first = (columns["problem_id"][0], columns["input_tokens"][0])
    size = 1
    while (
        size < len(columns["problem_id"])
        and (
            columns["problem_id"][size],
            columns["input_tokens"][size],
        )
        == first
    ):
        size += 1
    return size


class InflatedRewards(Behaviour):
    kind = "inflated_rewards"

    def tamper(self, path: Path, meta: RolloutMeta) -> None:
        def inflate(columns: dict[str, list], meta: RolloutMeta) -> RolloutMeta:
            group = _group_size(columns)
            columns["task_rewards"] = [1.0] * len(columns["task_rewards"])
            columns["rewards"] = [1.0 - p for p in columns["length_penalties"]]
            rewards = columns["rewards"]
            columns["advantages"] = [
                ADVANTAGE_FACTOR * a
                for i in range(0, len(rewards), group)
                for a in group_advantages(rewards[i : i + group]).tolist()
            ]
            return meta.model_copy(update={"num_nonzero": _nonzero(rewards, group)})

        _rewrite(path, inflate)


class CopiedProofs(Behaviour):
    kind = "copied_proofs"

    def tamper(self, path: Path, meta: RolloutMeta) -> None:
        def copy(columns: dict[str, list], meta: RolloutMeta) -> RolloutMeta:
            # Each proof is replaced by the first earlier one of the same size (same
            # number of chunks): well-formed, but the proof of another completion.
            proofs = columns["proofs"]
            first_of_size: dict[int, bytes] = {}
            for i, proof in enumerate(proofs):
                proofs[i] = first_of_size.setdefault(len(proof), proof)
            return meta

        _rewrite(path, copy)


class Garbage(Behaviour):
    kind = "garbage"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def tamper(self, path: Path, meta: RolloutMeta) -> None:
        def junk(columns: dict[str, list], meta: RolloutMeta) -> RolloutMeta:
            tokens = [t for row in columns["input_tokens"] + columns["output_tokens"] for t in row]
            low, high = min(tokens), max(tokens) + 1
            columns["output_tokens"] = [
                self.rng.integers(low, high, size=len(row)).tolist()
                for row in columns["output_tokens"]
            ]
            return meta

        _rewrite(path, junk)


class Copy(Behaviour):
    kind = "copy"

    def __init__(self, source: Path | None, address: str, wait: float = COPY_WAIT_SECONDS) -> None:
        self.source = source
        self.address = address
        self.wait = wait
        self.copied: set[Path] = set()

    def _find(self) -> tuple[Path, dict[str, list]] | None:
        """The newest file in the source folder that another worker uploaded."""
        if self.source is None:
            return None
        found = []
        for path in self.source.rglob("*.parquet"):
            try:
                found.append((path.stat().st_mtime, path))
            except OSError:
                continue
        for _, path in sorted(found, reverse=True):
            if path in self.copied:
                continue
            try:
                table, meta = read_rollouts(path)
            except RolloutFileError:
                continue
            if meta.worker_address != self.address:
                return path, table.to_pydict()
        return None

    def tamper(self, path: Path, meta: RolloutMeta) -> None:
        deadline = time.monotonic() + self.wait
        while (found := self._find()) is None:
            if time.monotonic() > deadline:
                log.info("no file of another worker to copy; uploading its own")
                return
            time.sleep(0.5)
        source, columns = found
        self.copied.add(source)
        if len(columns["problem_id"]) != meta.num_samples:
            log.info("%s has another size than the assignment; uploading its own", source.name)
            return
        group = _group_size(columns)
        # Its own assignment's step and id, its own address: what the upload checks.
        write_rollouts(
            path,
            columns,
            meta.model_copy(update={"num_nonzero": _nonzero(columns["rewards"], group)}),
        )
        log.info("copied %s as its own file", source.name)


def behaviour(kind: str | None, address: str, copy_from: Path | None = None) -> Behaviour:
    """The worker's behaviour: honest for None, else the named cheat."""
    if kind is None:
        return Behaviour()
    cheats: dict[str, Callable[[], Behaviour]] = {
        "wrong_model": WrongModel,
        "temperature": Temperature,
        "best_of_n": BestOfN,
        "inflated_rewards": InflatedRewards,
        "copied_proofs": CopiedProofs,
        "garbage": Garbage,
        "copy": lambda: Copy(copy_from, address),
    }
    if kind not in cheats:
        raise ValueError(f"unknown adversary kind {kind!r}; one of {', '.join(KINDS)}")
    return cheats[kind]()
