"""Report of the honest replay-drift runs: each worst honest figure against the validator's
default threshold for it, per model family and thread count.

Run: python benchmarks/drift_report.py drift.embedded.jsonl drift.gpt2.jsonl [...]

Reads the cells that ``bench_replay_drift.py --out drift`` writes (one JSON line per
family, worker threads, files per sampler call and validator threads; several runs'
files may be given, their cells are added up) and prints:

- per family and worker / validator thread count: samples, tokens, files not accepted;
- per family: every figure a check compares with a threshold, its worst honest value,
  the default threshold (``ValidatorSettings()``) and the margin, threshold / worst
  (how many times the honest worst fits under it; for p-values alpha / smallest p is
  printed as worst / threshold, so a margin above 1 means no reject either way);
- per family and candidate replay policy: the honest samples that policy rejects and the
  expected rejects per 100,000 samples (from the measured CDFs).

``bench_replay_drift.py`` prints the same report at the end of a run.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from swarmrl.validator import ValidatorSettings


def read_cells(paths: list[Path]) -> list[dict]:
    """Every cell of the given JSONL files (a file per family per run)."""
    cells = []
    for path in paths:
        cells += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return cells


def _sum(cells: list[dict], key: str) -> int:
    return sum(c[key] for c in cells)


def _rejects(cells: list[dict]) -> int:
    return sum(n for c in cells for state, n in c["verdicts"].items() if state != "accepted")


def counts(cells: list[dict]) -> list[dict]:
    """Samples, tokens and files not accepted per family and (worker, validator) threads."""
    keys = dict.fromkeys((c["family"], c["worker_threads"], c["validator_threads"]) for c in cells)
    rows = []
    for family, w, v in sorted(keys):
        group = [
            c
            for c in cells
            if (c["family"], c["worker_threads"], c["validator_threads"]) == (family, w, v)
        ]
        rows.append(
            {
                "family": family,
                "worker_threads": w,
                "validator_threads": v,
                "files": _sum(group, "files"),
                "samples": _sum(group, "samples"),
                "tokens": _sum(group, "tokens"),
                "not_accepted": _rejects(group),
                "reasons": [r for c in group for r in c["reasons"]][:5],
            }
        )
    return rows


def margins(cells: list[dict], settings: ValidatorSettings) -> list[dict]:
    """Per family, each thresholded figure: worst honest value, threshold, margin."""
    rows = []
    for family in dict.fromkeys(c["family"] for c in cells):
        group = [c for c in cells if c["family"] == family]
        t = settings.toploc
        figures = [
            # (figure, worst honest, threshold): a reject needs worst > threshold.
            (
                "replay bound drift, any CDF boundary (no reject by itself)",
                max(c["max_bound_drift"] for c in group),
                settings.replay_tolerance,
            ),
            (
                "replay: seed uniform outside its interval (vs 1e-6 slack)",
                max(c["max_replay_excess"] for c in group),
                min(settings.replay_floor_tolerance, settings.replay_tolerance),
            ),
            (
                "|reported - recomputed logprob|",
                max(c["max_logprob_diff"] for c in group),
                settings.logprob_tolerance,
            ),
            (
                "TOPLOC exponent mismatches (of 128)",
                max(c["max_exp_mismatches"] for c in group),
                t.max_exp_mismatches,
            ),
            (
                "TOPLOC mean mantissa error",
                max(c["max_mant_err_mean"] for c in group),
                t.max_mant_err_mean,
            ),
            (
                "TOPLOC median mantissa error",
                max(c["max_mant_err_median"] for c in group),
                t.max_mant_err_median,
            ),
            (
                "PIT test: alpha / smallest p",
                settings.sampling_alpha / max(min(c["min_pit_p"] for c in group), 1e-300),
                1.0,
            ),
            (
                "surprisal test: alpha / smallest p",
                settings.sampling_alpha
                / max(math.erfc(max(c["max_abs_z"] for c in group) / math.sqrt(2)), 1e-300),
                1.0,
            ),
        ]
        for name, worst, threshold in figures:
            rows.append(
                {
                    "family": family,
                    "figure": name,
                    "worst": worst,
                    "threshold": threshold,
                    "margin": threshold / worst if worst > 0 else math.inf,
                }
            )
    return rows


def policies(cells: list[dict]) -> list[dict]:
    """Per family and candidate replay policy: honest samples rejected, expected per 1e5."""
    rows = []
    for family in dict.fromkeys(c["family"] for c in cells):
        group = [c for c in cells if c["family"] == family]
        samples = max(_sum(group, "samples"), 1)
        for name in group[0]["expected_misses"]:
            rows.append(
                {
                    "family": family,
                    "policy": name,
                    "rejected": sum(c["rejected_samples"][name] for c in group),
                    "expected_per_100k": sum(c["expected_misses"][name] for c in group)
                    * 1e5
                    / samples,
                }
            )
    return rows


def report(cells: list[dict], settings: ValidatorSettings | None = None) -> dict:
    """Print the three tables; return them (for JSON)."""
    settings = settings or ValidatorSettings()
    tables = {"counts": counts(cells), "margins": margins(cells, settings)}
    tables["policies"] = policies(cells)
    print(f"{'family':10s} {'w/v thr':>7s} {'files':>6s} {'samples':>8s} {'tokens':>10s} rejects")
    for r in tables["counts"]:
        threads = f"{r['worker_threads']}/{r['validator_threads']}"
        print(
            f"{r['family']:10s} {threads:>7s} {r['files']:6d} {r['samples']:8d} "
            f"{r['tokens']:10d} {r['not_accepted']}"
        )
    for family in dict.fromkeys(r["family"] for r in tables["counts"]):
        rows = [r for r in tables["counts"] if r["family"] == family]
        print(
            f"{family}: {sum(r['samples'] for r in rows)} samples, "
            f"{sum(r['not_accepted'] for r in rows)} files not accepted"
        )
    print(f"\n{'family':10s} {'figure':55s} {'worst':>10s} {'threshold':>10s} {'margin':>8s}")
    for r in tables["margins"]:
        print(
            f"{r['family']:10s} {r['figure']:55s} {r['worst']:10.3g} {r['threshold']:10.3g} "
            f"{r['margin']:8.3g}"
        )
    print("\nreplay policy (tolerance/slack below the floor): honest rejects | expected per 1e5")
    for r in tables["policies"]:
        print(
            f"{r['family']:10s} {r['policy']:14s} {r['rejected']:5d} | {r['expected_per_100k']:.3g}"
        )
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", type=Path, nargs="+", help="JSONL files of bench_replay_drift")
    parser.add_argument("--json", action="store_true", help="also print the tables as JSON")
    args = parser.parse_args()
    tables = report(read_cells(args.cells))
    if args.json:
        print(json.dumps(tables))


if __name__ == "__main__":
    main()
