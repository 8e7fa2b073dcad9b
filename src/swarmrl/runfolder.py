"""The run folder's layout: the one place that names the files and folders of a run.

```
<output_dir>/<run_name>/
  config.json              the run's configuration
  summary.json             written by `swarmrl run` at the end
  metrics.jsonl            one line per trained step
  trainer_status.json      the step the trainer waits on and its usable samples so far
  trainer_done.json        written when the trainer has finished
  processes.json           `swarmrl run`'s processes: pid (= process group) and restarts
  checkpoints/step_<n>/    Hugging Face model directories (checkpoints.py writes them)
  checkpoints/trainer_state/step_<n>/     the trainer's resume state (sharded, trainer/state.py)
  orchestrator/            config.toml (its settings, derived from the run's config),
                           ledger.db (SQLite ledger), rollouts/ (the store of uploaded
                           files), secret, allowlist (the trusted roles' addresses)
  keys/<role>.key          the trainer's, validator's and relays' keys
  trainer/inbox/           uploaded files the trainer downloaded
  validator/inbox/         uploaded files the validator downloaded
  validator/verdicts.jsonl one verdict per judged rollout file
  logs/<process>.log       each process's output (written by `swarmrl run`)
  shardcast/               the origin's and relays' stores
<output_dir>/<run_name>.workers/worker-<i>/
                           a worker's own folder, outside the run folder: its key,
                           policy cache, outbox and stats.jsonl
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

STEP_FOLDER = re.compile(r"^step_(\d{6,})$")


def step_name(step: int) -> str:
    """`step_000042`: the folder name of a step, for checkpoints and rollouts alike."""
    return f"step_{step:06d}"


def step_of_folder(folder: Path) -> int | None:
    """The step a `step_<n>` folder names, or None for any other name."""
    match = STEP_FOLDER.match(Path(folder).name)
    return int(match.group(1)) if match else None


def checkpoint_dir(root: Path, step: int) -> Path:
    return Path(root) / step_name(step)


def list_checkpoints(root: Path) -> list[int]:
    """Steps of the complete checkpoints under root, ascending (a checkpoint is renamed
    into place whole, so one with its config.json is complete)."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        step = step_of_folder(entry)
        if step is not None and (entry / "config.json").exists():
            steps.append(step)
    return sorted(steps)


def latest_checkpoint(root: Path) -> int | None:
    steps = list_checkpoints(root)
    return steps[-1] if steps else None


@dataclass(frozen=True)
class RunFolder:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def trainer_status(self) -> Path:
        return self.root / "trainer_status.json"

    @property
    def trainer_done(self) -> Path:
        return self.root / "trainer_done.json"

    @property
    def processes(self) -> Path:
        return self.root / "processes.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rollouts(self) -> Path:
        """Not written by any role of a pool (files travel as uploads); tests use it as a
        place for rollout files named by step."""
        return self.root / "rollouts"

    def rollout_step(self, step: int) -> Path:
        return self.rollouts / step_name(step)

    @property
    def validator(self) -> Path:
        return self.root / "validator"

    @property
    def verdicts(self) -> Path:
        return self.validator / "verdicts.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, process: str) -> Path:
        return self.logs / f"{process}.log"

    @property
    def orchestrator(self) -> Path:
        return self.root / "orchestrator"

    @property
    def orchestrator_config(self) -> Path:
        """The orchestrator's settings, as `swarmrl run` derives them from the run's config."""
        return self.orchestrator / "config.toml"

    @property
    def ledger(self) -> Path:
        return self.orchestrator / "ledger.db"

    @property
    def store(self) -> Path:
        return self.orchestrator / "rollouts"

    @property
    def secret(self) -> Path:
        return self.orchestrator / "secret"

    @property
    def allowlist(self) -> Path:
        return self.orchestrator / "allowlist"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def key(self, role: str) -> Path:
        return self.keys / f"{role}.key"

    @property
    def trainer_inbox(self) -> Path:
        return self.root / "trainer" / "inbox"

    @property
    def validator_inbox(self) -> Path:
        return self.validator / "inbox"

    @property
    def workers(self) -> Path:
        """The workers' folders: beside the run folder, never inside it (a worker never
        reads or writes the run folder)."""
        return self.root.parent / f"{self.root.name}.workers"

    def worker_dir(self, index: int) -> Path:
        return self.workers / f"worker-{index}"

    def adversary_dir(self, kind: str) -> Path:
        """The folder of the cheating worker of this kind (`swarmrl run --adversary`)."""
        return self.workers / f"adversary-{kind}"

    @property
    def shardcast(self) -> Path:
        return self.root / "shardcast"
