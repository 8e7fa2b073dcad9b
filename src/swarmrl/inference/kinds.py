"""The kinds of cheating worker (`adversary.py`), by name: importable without torch, so the
command line can list them without loading a model library."""

from __future__ import annotations

KINDS: dict[str, str] = {
    "wrong_model": "generates with a 4-bit-quantized copy of the policy it claims",
    "temperature": "samples at half the run's temperature and claims the run's",
    "best_of_n": "samples each group with other seeds, keeps the best-rewarded, claims the assigned seeds",
    "inflated_rewards": "claims every answer correct and scales the advantages up",
    "copied_proofs": "gives samples the TOPLOC proof of another sample of the file",
    "garbage": "replaces the completions by random tokens",
    "copy": "re-uploads another worker's stored file as its own, metadata rewritten",
}


def parse_kinds(text: str) -> list[str]:
    """'a,b' -> ['a', 'b']; ValueError (one line, naming the known kinds) for an unknown kind."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"unknown adversary kind {', '.join(unknown) or repr(text)}; "
            f"one or more of {', '.join(KINDS)}, comma-separated"
        )
    return list(dict.fromkeys(kinds))
