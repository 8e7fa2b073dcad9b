"""TOPLOC: locality-sensitive proofs that a worker's tokens came from the claimed model.

``build_proofs`` (worker) and ``verify_proofs`` (validator) in ``proofs``; the proof
bytes and the rollout file's concatenated ``proofs`` column in ``encoding``; the
GF(65497) arithmetic in ``gf``. Byte-compatible with the reference ``toploc`` 0.1.6;
see docs/toploc.md.
"""

from swarmrl.toploc.encoding import (
    ProofFormatError,
    bytes_to_proofs,
    chunk_points,
    encode_proof,
    parse_proof,
    proofs_to_bytes,
)
from swarmrl.toploc.proofs import ChunkCheck, ToplocThresholds, build_proofs, verify_proofs

__all__ = [
    "ChunkCheck",
    "ProofFormatError",
    "ToplocThresholds",
    "build_proofs",
    "bytes_to_proofs",
    "chunk_points",
    "encode_proof",
    "parse_proof",
    "proofs_to_bytes",
    "verify_proofs",
]
