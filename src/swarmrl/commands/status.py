"""`swarmrl status`: print the pool as the orchestrator sees it."""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from swarmrl.protocol import models as api


def render(status: api.PoolStatus, console: Console, now: float | None = None) -> None:
    now = time.time() if now is None else now
    checkpoint = (
        f"checkpoint {status.checkpoint.step} (blake3 {status.checkpoint.blake3[:12]}…)"
        if status.checkpoint
        else "no checkpoint yet"
    )
    state = "finished" if status.finished else f"step {status.step}"
    console.print(f"[bold]pool[/bold]: {state}, {checkpoint}")
    if status.recipe is not None:
        stated = {k: v for k, v in status.recipe.model_dump().items() if v is not None}
        console.print("recipe: " + ", ".join(f"{k} {v}" for k, v in stated.items()))

    members = Table(title="members")
    for column in ("address", "role", "status", "last heartbeat", "lapses", "url"):
        members.add_column(column)
    for column in ("balance", "stake", "paid", "unpaid"):
        members.add_column(column, justify="right")
    for m in status.members:
        seen = f"{now - m.last_heartbeat:.0f} s ago" if m.last_heartbeat else "-"
        members.add_row(
            m.address,
            m.role,
            m.status,
            seen,
            str(m.lapses),
            m.url or "",
            *(f"{x:g}" for x in (m.balance, m.stake, m.paid, m.unpaid)),
        )
    console.print(members)

    steps = Table(title="steps (newest first)")
    for column in ("step", "usable/target", "files", "open", "lapsed", "trained", "full"):
        steps.add_column(column)
    for s in status.steps:
        steps.add_row(
            str(s.step),
            f"{s.usable_samples}/{s.target_samples}",
            str(s.submissions),
            str(s.open_assignments),
            str(s.lapsed_assignments),
            str(s.trained),
            "yes" if s.full else "",
        )
    console.print(steps)

    order = ("trained", "accepted", "pending", "voided", "rejected")
    states = [k for k in order if k in status.submissions]
    states += sorted(set(status.submissions) - set(order))
    by_state = ", ".join(f"{status.submissions[k]} {k}" for k in states) or "none"
    console.print(f"submissions: {by_state}")
    console.print(
        f"verdicts: {status.verdicts.get('accepted', 0)} accepted, "
        f"{status.verdicts.get('rejected', 0)} rejected, "
        f"{status.verdicts.get('soft', 0)} soft (voided, not slashed)"
    )
    credits = Table(title="contributions (accepted work)")
    for column in ("worker", "files", "samples", "tokens"):
        credits.add_column(column)
    for c in status.contributions:
        credits.add_row(c.worker, str(c.files), str(c.samples), str(c.tokens))
    console.print(credits)
    if status.refusals:
        refused = Table(
            title="refused registrations (newest first, since the orchestrator started)"
        )
        for column in ("address", "role", "when", "reason"):
            refused.add_column(column)
        for r in status.refusals:
            refused.add_row(r.address, r.role, f"{now - r.at:.0f} s ago", r.reason)
        console.print(refused)
    if status.slashings:
        caught = Table(title="slashed and ejected")
        for column in ("worker", "step", "file", "check failed", "slashed", "voided", "tainted"):
            caught.add_column(column)
        for x in status.slashings:
            used_in = f" (steps {', '.join(map(str, x.tainted_steps))})" if x.tainted_steps else ""
            caught.add_row(
                x.address,
                str(x.step),
                x.file_hash[:12],
                x.reason,
                f"{x.slashed:g}",
                str(x.voided_files),
                f"{x.tainted_files}{used_in}",
            )
        console.print(caught)


def _status(args: argparse.Namespace) -> int:
    from swarmrl.protocol.client import PoolClient, PoolRefused  # not at parser build time

    try:
        with PoolClient(args.orchestrator, None, timeout=args.timeout) as client:
            status = client.status()
    except (PoolRefused, OSError) as exc:
        print(f"swarmrl status: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 (httpx's transport errors: report, don't trace)
        print(f"swarmrl status: cannot reach {args.orchestrator}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(status.model_dump_json(indent=2))
    else:
        render(status, Console())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status", help="print the pool: members, health, step, submissions, verdicts, contributions"
    )
    p.add_argument(
        "--orchestrator", required=True, help="orchestrator URL, e.g. http://127.0.0.1:8700"
    )
    p.add_argument("--json", action="store_true", help="print the raw status JSON instead")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")
    p.set_defaults(func=_status)
