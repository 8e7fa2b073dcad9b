"""TOPLOC: locality-sensitive proofs that a worker's tokens came from the claimed model.

``build_proofs`` (worker) and ``verify_proofs`` (validator) in ``proofs``, with
``build_proofs_batch`` and ``verify_proofs_batch`` for a whole rollout file; the proof
bytes and the rollout file's concatenated ``proofs`` column in ``encoding``; the
GF(65497) arithmetic in ``gf``. Byte-compatible with the reference ``toploc`` 0.1.6;
see docs/toploc.md.
"""

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
    ToplocThresholds,
    build_proofs,
    build_proofs_batch,
    verify_proofs,
    verify_proofs_batch,
)

__all__ = [
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
    "proofs_to_bytes",
    "verify_proofs",
    "verify_proofs_batch",
]
