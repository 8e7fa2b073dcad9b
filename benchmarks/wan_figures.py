"""The figures of one bench_wan.py run, from the files its roles leave: pure functions.

Inputs are what the roles write anyway: the trainer's `metrics.jsonl` records, the
orchestrator's `announced_at` per checkpoint, and the log lines of `swarmrl worker` and
`swarmrl relay` (`%(asctime)s`, local time, millisecond resolution; all namespaces share
the machine's clock). Nothing here starts a process.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_LOADED = re.compile(_STAMP + r" \S+ INFO loaded policy step (\d+),")
_FETCHED = re.compile(
    _STAMP + r" \S+ INFO fetched policy (\d+) by (\w+): (\d+) bytes in ([\d.]+) s"
)
_HOLDS = re.compile(_STAMP + r" \S+ INFO relay now holds v(\d+) ")


def stamp_time(text: str) -> float:
    """Unix time of a logging `asctime` ("2026-12-03 17:05:36,123", local time)."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass(frozen=True)
class Fetch:
    """One policy fetch a worker logged: when it finished, which way, how much, how long."""

    step: int
    done: float
    route: str
    nbytes: int
    seconds: float


@dataclass
class WorkerLog:
    """What one worker's log says about the policies it fetched and loaded."""

    loaded: dict[int, float] = field(default_factory=dict)
    fetches: dict[int, Fetch] = field(default_factory=dict)


def _stamped(pattern: re.Pattern, text: str):
    """(time, match) for each line that matches `pattern` and has a valid time."""
    for line in text.splitlines():
        if m := pattern.match(line):
            try:
                yield stamp_time(m[1]), m
            except ValueError:  # a line cut or garbled where the time is
                continue


def parse_worker_log(text: str) -> WorkerLog:
    """Loaded and fetched policies by step (the first line per step counts); lines that
    are not these two kinds are ignored."""
    out = WorkerLog()
    for t, m in _stamped(_LOADED, text):
        out.loaded.setdefault(int(m[2]), t)
    for t, m in _stamped(_FETCHED, text):
        try:
            seconds = float(m[5])
        except ValueError:  # "1.2.3"
            continue
        out.fetches.setdefault(int(m[2]), Fetch(int(m[2]), t, m[3], int(m[4]), seconds))
    return out


def parse_relay_log(text: str) -> dict[int, float]:
    """When the relay finished mirroring each version ("relay now holds vN")."""
    held: dict[int, float] = {}
    for t, m in _stamped(_HOLDS, text):
        held.setdefault(int(m[2]), t)
    return held


# per-worker figures, each (median, worst) over the run's checkpoints
WORKER_TIMES = ("announce_to_loaded_s", "announce_to_fetch_start_s", "fetch_s", "load_s")


def median_max(values: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(values), max(values)) if values else (None, None)


def run_figures(
    steps: list[dict],
    announced: dict[int, float],
    workers: list[WorkerLog],
    relay_held: dict[int, float],
    served: dict[str, int | None],
    skip_steps: int = 1,
) -> dict:
    """One run's figures. Steps before `skip_steps` (the roles starting, policy 0's first
    fetch) are left out of idle and step time; so are checkpoints up to `skip_steps`."""
    steady = [s for s in steps if s["step"] >= skip_steps]
    wait = sum(s["wait_seconds"] for s in steady)
    busy = sum(s["step_seconds"] for s in steady)
    out: dict = {
        "steps": len(steps),
        "steady_steps": len(steady),
        "trainer_idle": wait / busy if busy else None,
        "seconds_per_step": busy / len(steady) if steady else None,
        "origin_bytes": served.get("origin"),
        "relay_bytes": served.get("relay"),
    }
    late = {s: t for s, t in announced.items() if s > skip_steps}
    mirror = [relay_held[s] - t for s, t in late.items() if s in relay_held]
    out["relay_mirror_s"] = median_max(mirror)
    per_worker = []
    for log in workers:
        to_loaded = [log.loaded[s] - t for s, t in late.items() if s in log.loaded]
        starts = {s: f.done - f.seconds for s, f in log.fetches.items()}
        to_start = [starts[s] - t for s, t in late.items() if s in starts]
        fetch_s = [f.seconds for s, f in log.fetches.items() if s in late]
        load_s = [
            log.loaded[s] - f.done for s, f in log.fetches.items() if s in late and s in log.loaded
        ]
        routes: dict[str, int] = {}
        for f in log.fetches.values():
            routes[f.route] = routes.get(f.route, 0) + 1
        per_worker.append(
            {
                "announce_to_loaded_s": median_max(to_loaded),
                "announce_to_fetch_start_s": median_max(to_start),
                "fetch_s": median_max(fetch_s),
                "load_s": median_max(load_s),
                "loaded": len(to_loaded),
                "routes": routes,
                "bytes_fetched": sum(f.nbytes for f in log.fetches.values()),
            }
        )
    out["workers"] = per_worker
    return out


def spread(values: list[float | None]) -> dict:
    """Median, min and max of the runs' values that exist."""
    have = [v for v in values if v is not None]
    if not have:
        return {"median": None, "min": None, "max": None, "runs": 0}
    return {
        "median": statistics.median(have),
        "min": min(have),
        "max": max(have),
        "runs": len(have),
    }


def config_summary(runs: list[dict]) -> dict:
    """One configuration over its repeats: each figure's median and spread. Per-worker
    announcement-to-loaded figures are pooled over workers (the median of their medians,
    the worst of their worsts)."""

    def pooled(key: str, index: int, pick) -> list[float | None]:
        vals = []
        for run in runs:
            got = [w[key][index] for w in run["workers"] if w[key][index] is not None]
            vals.append(pick(got) if got else None)
        return vals

    return {
        "trainer_idle": spread([r["trainer_idle"] for r in runs]),
        "seconds_per_step": spread([r["seconds_per_step"] for r in runs]),
        "loaded_median_s": spread(pooled("announce_to_loaded_s", 0, statistics.median)),
        "loaded_worst_s": spread(pooled("announce_to_loaded_s", 1, max)),
        "fetch_start_median_s": spread(pooled("announce_to_fetch_start_s", 0, statistics.median)),
        "fetch_median_s": spread(pooled("fetch_s", 0, statistics.median)),
        "load_median_s": spread(pooled("load_s", 0, statistics.median)),
        "relay_mirror_median_s": spread([r["relay_mirror_s"][0] for r in runs]),
        "origin_mb": spread([mb(r["origin_bytes"]) for r in runs]),
        "relay_mb": spread([mb(r["relay_bytes"]) for r in runs]),
    }


def mb(n: int | None) -> float | None:
    return None if n is None else n / 1e6


def cell(s: dict, digits: int = 2) -> str:
    """`median [min–max]`, or the median alone for one run; '–' for none."""
    if s["median"] is None:
        return "–"
    med = f"{s['median']:.{digits}f}"
    if s["runs"] < 2:
        return med
    return f"{med} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


ROWS = [
    ("runs", None, 0),
    ("trainer idle", "trainer_idle", 2),
    ("s / step", "seconds_per_step", 2),
    ("announce→loaded median s", "loaded_median_s", 2),
    ("announce→loaded worst s", "loaded_worst_s", 2),
    ("relay mirror median s", "relay_mirror_median_s", 2),
    ("announce→fetch start median s", "fetch_start_median_s", 2),
    ("fetch median s", "fetch_median_s", 2),
    ("load median s", "load_median_s", 2),
    ("origin MB served", "origin_mb", 1),
    ("relay MB served", "relay_mb", 1),
]


def table(summaries: dict[str, dict]) -> str:
    """A Markdown table: one column per configuration, one row per figure."""
    names = list(summaries)
    lines = [
        "| figure | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for label, key, digits in ROWS:
        if key is None:
            cells = [str(summaries[n]["trainer_idle"]["runs"]) for n in names]
        else:
            cells = [cell(summaries[n][key], digits) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
