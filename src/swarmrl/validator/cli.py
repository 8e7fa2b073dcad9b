"""The `swarmrl validate` subcommand: judge one rollout file, print the verdict, exit 0/1/2."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _validate(args: argparse.Namespace) -> int:
    import torch

    from swarmrl.rollouts import file_hash
    from swarmrl.toploc.thresholds import TOPLOC_PRESETS
    from swarmrl.validator.settings import ValidatorSettings
    from swarmrl.validator.verdict import (
        Status,
        selected_for_validation,
        unusable,
        validate_file,
        verdict_json,
        verdict_line,
    )

    if not args.file.is_file():
        what = "is a directory, not a rollout file" if args.file.is_dir() else "no such file"
        print(f"swarmrl validate: {args.file}: {what}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fraction is not None:
        if args.secret_file is None:
            print("swarmrl validate: --fraction needs --secret-file", file=sys.stderr)
            return 2
        try:
            chosen = selected_for_validation(
                file_hash(args.file), args.secret_file.read_bytes(), args.fraction
            )
        except OSError as exc:
            print(f"swarmrl validate: unusable: {exc}", file=sys.stderr)
            return 2
        if not chosen:
            print(
                f"{args.file}: skipped: not among the {args.fraction:.0%} of files chosen for validation"
            )
            return 0
    if (args.orchestrator is None) != (args.key is None):
        print("swarmrl validate: --orchestrator and --key go together", file=sys.stderr)
        return 2
    seed = None
    if args.orchestrator is not None:
        try:
            seed = issued_seed(args.orchestrator, args.key, file_hash(args.file))
        except (OSError, ValueError) as exc:
            print(f"{args.file}: unusable: {exc}", file=sys.stderr)
            return 2
    settings = ValidatorSettings(toploc=TOPLOC_PRESETS[args.toploc])
    if args.min_eos_prob is not None:
        settings = settings.model_copy(update={"min_eos_prob": args.min_eos_prob})
    # The verdict's one line is the command's output; the traceback of an internal error
    # (which the validator logs) is not for the terminal.
    quiet = logging.getLogger("swarmrl.validator")
    quiet.propagate, propagate = False, quiet.propagate
    quiet.addHandler(silent := logging.NullHandler())
    try:
        verdict = validate_file(
            args.file, model_dir=args.model, config_path=args.config, settings=settings, seed=seed
        )
    finally:
        quiet.propagate = propagate
        quiet.removeHandler(silent)
    if seed is None and verdict.failures and verdict.failures[0].check == "assignment":
        verdict = unusable(
            "the assignment cannot be checked without the orchestrator: the rows are not "
            "the assignment the run seed, worker, step and counter give (what files built "
            "offline use), and a pool file's seeds come from the orchestrator's secret; pass "
            "--orchestrator URL --key FILE (a validator's or the trainer's key)"
        )
    if args.json:
        print(verdict_json(verdict, args.file))
    else:
        print(
            verdict_line(verdict, args.file),
            file=sys.stderr if verdict.status == Status.UNUSABLE else sys.stdout,
        )
    return verdict.exit_code


def issued_seed(url: str, key: Path, digest: str) -> int:
    """The seed the orchestrator issued with the assignment the file with this hash
    answers; ValueError (or OSError for the key file) with a line saying why not."""
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.protocol import PoolClient, PoolRefused, PoolUnreachable

    try:
        identity = load_identity(key)
    except KeyFileError as exc:
        raise ValueError(str(exc)) from None
    with PoolClient(url, identity, retry_seconds=10.0) as client:
        try:
            handed = client.submission(digest)
        except PoolRefused as exc:
            if exc.code == "not_found":
                raise ValueError(
                    f"the orchestrator at {url} has no submission with this file's SHA-256 "
                    f"{digest}: not a file of this pool, or changed since it was uploaded"
                ) from None
            raise ValueError(f"the orchestrator at {url} refused: {exc.detail}") from None
        except PoolUnreachable as exc:
            raise ValueError(str(exc)) from None
    if handed.assignment is None:
        raise ValueError(f"the orchestrator at {url} gave no assignment for {digest}")
    return handed.assignment.seed


def register(subparsers) -> None:
    """Add `validate` to the `swarmrl` command's subparsers."""
    from swarmrl.toploc.thresholds import TOPLOC_PRESETS, toploc_preset_help

    p = subparsers.add_parser(
        "validate",
        help="check a rollout file (TOPLOC, sampling, termination, assignment, values); exit 0 accepted, 1 rejected, 2 unusable",
        description="Recompute every sample with one batched prefill of the claimed checkpoint and run the validator's checks "
        "(docs/validator.md). Exit code 0: accepted, 1: rejected (the reason names the check and sample), "
        "2: the input cannot be judged (unreadable file, wrong schema or metadata, values outside the run's bounds, "
        "malformed proofs, missing checkpoint or config). A file repeating an earlier file of its folder "
        "(same bytes or same assignment) is rejected as a duplicate.",
    )
    p.add_argument(
        "file",
        type=Path,
        help="rollout Parquet file (<run>/rollouts/step_<n>/<address>-<counter>.parquet)",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="the claimed checkpoint directory [default: <run>/checkpoints/step_<policy_step>]",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the run's config (JSON or TOML) [default: <run>/config.json]",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the verdict as one JSON object (status, reason, failures, figures)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads for the prefill")
    p.add_argument(
        "--toploc",
        choices=list(TOPLOC_PRESETS),
        default="fp32",
        help=f"TOPLOC thresholds (exponent mismatches / mean / median mantissa error): {toploc_preset_help()} [default: fp32]",
    )
    p.add_argument(
        "--min-eos-prob",
        type=float,
        default=None,
        help="probability an ending EOS must exceed [default: 0.1]",
    )
    p.add_argument(
        "--fraction",
        type=float,
        default=None,
        help="validate only this fraction of files, chosen by HMAC(secret, file hash); others exit 0 as skipped",
    )
    p.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="the validator's secret for --fraction (keep it from workers)",
    )
    p.add_argument(
        "--orchestrator",
        default=None,
        help="the pool's orchestrator URL: the file's assignment seed is asked from it (a pool "
        "file's seeds come from the orchestrator's secret; without it, the assignment check "
        "can be made only for files built offline)",
    )
    p.add_argument(
        "--key",
        type=Path,
        default=None,
        help="key file of a validator or the trainer (on the pool's allowlist), with --orchestrator",
    )
    p.set_defaults(func=_validate)


def main(argv: list[str] | None = None) -> int:
    """`python -m swarmrl.validator.cli FILE ...`: the same command without the `swarmrl` front end."""
    parser = argparse.ArgumentParser(prog="swarmrl")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["validate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
