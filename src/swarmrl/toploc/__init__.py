"""TOPLOC: locality-sensitive proofs that a worker's tokens came from the claimed model.

``build_proofs`` (worker) and ``verify_proofs`` (validator) in ``proofs``, with
``build_proofs_batch``, ``verify_proofs_batch`` and ``proof_column`` for a whole rollout file; the proof
bytes and the rollout file's concatenated ``proofs`` column in ``encoding``; the
GF(65497) arithmetic in ``gf``; the chunk thresholds and their named presets
(``TOPLOC_PRESETS``) in ``thresholds``. Byte-compatible with the reference ``toploc`` 0.1.6;
see docs/toploc.md.

Names are loaded on first use (PEP 562), so that reading the thresholds does not load
torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "FP32_TOPLOC": "thresholds",
    "PAPER_TOPLOC": "thresholds",
    "TOPLOC_PRESETS": "thresholds",
    "ChunkCheck": "proofs",
    "ProofFormatError": "encoding",
    "ToplocThresholds": "thresholds",
    "build_proofs": "proofs",
    "build_proofs_batch": "proofs",
    "proof_column": "proofs",
    "bytes_to_proofs": "encoding",
    "chunk_points": "encoding",
    "encode_proof": "encoding",
    "encode_proofs": "encoding",
    "parse_proof": "encoding",
    "proofs_to_bytes": "encoding",
    "verify_proofs": "proofs",
    "verify_proofs_batch": "proofs",
    "toploc_preset_help": "thresholds",
}

if TYPE_CHECKING:
    from swarmrl.toploc.encoding import (
        ProofFormatError,
        bytes_to_proofs,
        chunk_points,
        encode_proof,
        encode_proofs,
        parse_proof,
        proofs_to_bytes,
    )
    from swarmrl.toploc.proofs import (
        ChunkCheck,
        build_proofs,
        build_proofs_batch,
        proof_column,
        verify_proofs,
        verify_proofs_batch,
    )
    from swarmrl.toploc.thresholds import (
        FP32_TOPLOC,
        PAPER_TOPLOC,
        TOPLOC_PRESETS,
        ToplocThresholds,
        toploc_preset_help,
    )


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


__all__ = [
    "FP32_TOPLOC",
    "PAPER_TOPLOC",
    "TOPLOC_PRESETS",
    "ChunkCheck",
    "ProofFormatError",
    "ToplocThresholds",
    "build_proofs",
    "build_proofs_batch",
    "bytes_to_proofs",
    "chunk_points",
    "encode_proof",
    "encode_proofs",
    "parse_proof",
    "proof_column",
    "proofs_to_bytes",
    "toploc_preset_help",
    "verify_proofs",
    "verify_proofs_batch",
]
