"""What a finished run sums up to: the typed `RunSummary` written to `summary.json`, its
parts (accounts, cheaters, the ledger's and the servers' figures) and the console tables."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field, field_serializer
from rich.console import Console
from rich.table import Table

from swarmrl.identity import load_identity
from swarmrl.jsonl import read_jsonl
from swarmrl.ledger import Ledger, check_ledger, upload_totals
from swarmrl.protocol import models as api
from swarmrl.run.launch import ledger_url
from swarmrl.run.watch import SlashingWatch
from swarmrl.runfolder import RunFolder


class WorkerAccount(BaseModel):
    """A worker process's funds, as the orchestrator last showed them."""

    status: str = Field(description="healthy, unhealthy or dead (by heartbeats), or ejected")
    balance: float = Field(description="funds the address holds, not locked")
    stake: float = Field(description="funds locked as the worker's stake")
    paid: float = Field(description="paid out for its work so far")
    unpaid: float = Field(description="credited work not paid yet")


class Cheater(BaseModel):
    """An adversary of the run: caught or not (the caught_* fields only when caught), and
    ejected or not."""

    name: str = Field(description="its process name, adversary-<kind>")
    kind: str = Field(description="its kind of cheating (inference/adversary.py)")
    address: str = Field(description="its key's address")
    caught: bool = Field(description="the orchestrator slashed it")
    caught_at: float | None = Field(None, description="unix time of the slashing")
    step: int | None = Field(None, description="the step of the file that was rejected")
    check: str | None = Field(None, description="the check that failed")
    reason: str | None = Field(None, description="the validator's reason")
    slashed: float | None = Field(None, description="the stake slashed")
    files_voided: int | None = Field(None, description="its files voided, not yet trained")
    files_tainted: int | None = Field(None, description="its files already trained")
    tainted_steps: list[int] | None = Field(None, description="the steps they were trained in")
    ejected: bool = Field(description="the pool ejected it")
    stopped_on_ejection: bool = Field(description="its process exited on the ejection")


class LedgerFigures(BaseModel):
    """What the ledger says once the orchestrator has stopped."""

    files_uploaded: int
    samples_generated: int
    files_trained: int
    ledger_problems: list[str] = Field(description="every broken invariant; empty: consistent")


class RunSummary(BaseModel):
    """`<run>/summary.json`: what `swarmrl run` measured, in this order."""

    run: str = Field(description="the run's name")
    run_dir: str = Field(description="the run folder")
    start_model: str = Field(description="the model the run started from")
    async_level: int = Field(description="the run's async_level")
    workers: int = Field(description="honest worker processes")
    accuracy_before: float | None = Field(description="held-out accuracy of the start model")
    accuracy_after: float | None = Field(description="held-out accuracy of the final checkpoint")
    length_error_before: float | None = Field(description="length error of the start model")
    length_error_after: float | None = Field(description="length error of the final checkpoint")
    eval_problems: int | None = Field(description="held-out problems evaluated")
    steps: int = Field(description="steps in the trainer's metrics")
    final_step: int | None = Field(description="the newest checkpoint")
    samples_trained: int = Field(description="samples the trainer trained on")
    samples_read: int = Field(description="samples the trainer read")
    samples_generated: int = Field(description="samples the workers uploaded")
    generated_per_read: float | None = Field(description="samples_generated / samples_read")
    files_uploaded: int = Field(description="rollout files the workers uploaded")
    files_trained: int = Field(description="of them, those trained on")
    ledger_problems: list[str] = Field(description="the ledger's broken invariants")
    staleness_max: int | None = Field(description="the largest staleness trained on")
    trainer_idle_fraction: float | None = Field(description="trainer wait over step time")
    bytes_served: dict[str, int | None] = Field(description="bytes each SHARDCAST server served")
    proof_share_of_generation: float | None = Field(
        description="TOPLOC proof building's CPU time over generation time"
    )
    proof_wait_share_of_generation: float | None = Field(
        description="time generation waited for proofs over generation time"
    )
    validation: dict[str, int | float] | None = Field(
        description="the validated fraction and the verdicts by status (None: no validator)"
    )
    restarts: dict[str, int] = Field(description="restarts per process")
    restarts_total: int = Field(description="restarts of all processes")
    slashings: int = Field(description="slashings the orchestrator recorded")
    accounts: dict[str, WorkerAccount] = Field(description="per worker process, its funds")
    cheaters: list[Cheater] = Field(description="per adversary, caught or not")
    wall_seconds: float = Field(description="the run's wall-clock time")
    cpu_seconds: dict[str, float] = Field(
        description="CPU-seconds (user + system) per process: each role's (its restarts and "
        "the children it waited for added up) and `run`, this command's own (the "
        "evaluations, the origin's server, the supervision)"
    )

    @field_serializer("cheaters")
    def _cheaters(self, cheaters: list[Cheater]) -> list[dict]:
        return [c.model_dump(exclude_none=True) for c in cheaters]

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(), indent=2))

    def print(self, console: Console) -> None:
        """The summary as tables: the metrics, the workers' accounts, the cheaters (if any)."""
        table = Table(title=f"swarmrl run {self.run}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in self.model_dump().items():
            if key in ("accounts", "cheaters"):
                continue  # tables of their own
            table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
        console.print(table)
        console.print(accounts_table(self.accounts))
        if self.cheaters:
            console.print(cheaters_table(self.cheaters))


def worker_accounts(
    status: api.PoolStatus | None, names: dict[str, str]
) -> dict[str, WorkerAccount]:
    """Per worker process (honest or not), as the orchestrator last showed it: its status
    and its funds (balance, stake, paid, unpaid)."""
    return {
        names.get(m.address, m.address): WorkerAccount(
            status=m.status, balance=m.balance, stake=m.stake, paid=m.paid, unpaid=m.unpaid
        )
        for m in (status.members if status else [])
        if m.role == "worker"
    }


def cheaters_summary(
    adversaries: Sequence[str],
    keys: dict[str, Path],
    watch: SlashingWatch,
    stopped: set[str],
) -> list[Cheater]:
    """Per adversary: its address; when and by which check it was caught and what it
    lost; whether the pool ejected it, and whether its process stopped on the ejection
    (`stopped`: a cheater caught after the run finished just ends with the run)."""
    members = {m.address: m for m in (watch.status.members if watch.status else [])}
    out = []
    for kind in adversaries:
        name = f"adversary-{kind}"
        address = load_identity(keys[name]).address
        caught = next((s for s in watch.seen if s.address == address), None)
        member = members.get(address)
        cheater = Cheater(
            name=name,
            kind=kind,
            address=address,
            caught=caught is not None,
            ejected=member is not None and member.status == "ejected",
            stopped_on_ejection=name in stopped,
        )
        if caught is not None:
            cheater = cheater.model_copy(
                update={
                    "caught_at": caught.at,
                    "step": caught.step,
                    "check": api.failed_check(caught.reason),
                    "reason": caught.reason,
                    "slashed": caught.slashed,
                    "files_voided": caught.voided_files,
                    "files_tainted": caught.tainted_files,
                    "tainted_steps": caught.tainted_steps,
                }
            )
        out.append(cheater)
    return out


def ledger_figures(folder: RunFolder) -> LedgerFigures:
    """What the ledger says once the orchestrator has stopped: the files and samples the
    workers uploaded, and every broken invariant (nothing lost or counted twice)."""
    ledger = Ledger(ledger_url(folder))
    try:
        with ledger.session() as session:
            uploads = upload_totals(session)
            problems = check_ledger(session)
    finally:
        ledger.close()
    return LedgerFigures(
        files_uploaded=uploads.files,
        samples_generated=uploads.samples,
        files_trained=uploads.files_trained,
        ledger_problems=problems,
    )


def proof_figures(workers: Path) -> dict[str, float | None]:
    """From the workers' per-file stats: TOPLOC proof building's CPU time, and the time
    generation waited for it (it is built off the generation loop), each over generation time."""
    gen = proofs = waited = 0.0
    for path in workers.glob("worker-*/stats.jsonl"):
        for record in read_jsonl(path):  # a line cut short by a killed worker is skipped
            try:
                gen += record["gen_seconds"]
                proofs += record["proof_seconds"]
                waited += record.get("proof_wait_seconds", 0.0)
            except (KeyError, TypeError):
                continue
    return {
        "proof_share_of_generation": round(proofs / gen, 4) if gen else None,
        "proof_wait_share_of_generation": round(waited / gen, 4) if gen else None,
    }


def accounts_table(accounts: dict[str, WorkerAccount]) -> Table:
    table = Table(title="workers")
    for column in ("worker", "status", "balance", "stake", "paid", "unpaid"):
        table.add_column(column, justify="left" if column in ("worker", "status") else "right")
    for name, a in sorted(accounts.items()):
        table.add_row(name, a.status, *(f"{v:g}" for v in (a.balance, a.stake, a.paid, a.unpaid)))
    return table


def cheaters_table(cheaters: list[Cheater]) -> Table:
    table = Table(title="cheaters")
    for column in (
        "worker",
        "caught at",
        "step",
        "check",
        "slashed",
        "voided",
        "tainted",
        "ejected",
    ):
        table.add_column(column)
    for c in cheaters:
        if not c.caught:
            table.add_row(c.name, "not caught", "", "", "", "", "", "yes" if c.ejected else "no")
            continue
        table.add_row(
            c.name,
            time.strftime("%H:%M:%S", time.localtime(c.caught_at)),
            str(c.step),
            c.check,
            f"{c.slashed:g}",
            str(c.files_voided),
            str(c.files_tainted),
            "yes" if c.ejected else "no",
        )
    return table
