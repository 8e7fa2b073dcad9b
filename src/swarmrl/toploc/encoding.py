"""TOPLOC proof bytes: encode, parse and validate chunk proofs, and split a rollout's column.

One chunk proof (byte-compatible with the reference ``toploc`` 0.1.6) is

    m (uint16 big-endian) | c_0 | c_1 | ... | c_{k-1}   (each uint16 big-endian)

where m is the modulus applied to the chunk's flat indices and c_i are the
coefficients, lowest degree first, of the polynomial over GF(65497) through the
chunk's top-k values. With the default k = 128 a proof is 258 bytes.

Proof bytes come from untrusted workers, so ``parse_proof`` checks every field and
raises ``ProofFormatError`` (a ``ValueError``) naming the problem; it never reads
past the buffer and its cost is linear in the length.

A rollout file stores a sequence's proofs concatenated (docs/architecture.md §4.2). The pieces are
not self-delimiting: every chunk proof has 2 + 2·min(topk, values in the chunk)
bytes, so splitting needs the number of tokens, the hidden size, the chunk size and
topk. ``chunk_points`` gives those lengths, ``bytes_to_proofs`` splits and checks.
"""

from __future__ import annotations

import itertools

import numpy as np

from swarmrl.toploc.gf import P

MAX_MODULUS = P
"""Largest valid modulus m: the field prime (a chunk of <= 65497 values always gets it)."""


class ProofFormatError(ValueError):
    """Proof bytes that cannot be a TOPLOC proof; the message says which field is wrong."""


def encode_proof(modulus: int, coeffs: np.ndarray) -> bytes:
    """Serialize one chunk proof: m then the coefficients, all uint16 big-endian."""
    words = np.concatenate(([modulus], np.asarray(coeffs, dtype=np.int64).reshape(-1)))
    if words.min() < 0 or words.max() >= 1 << 16:
        raise ValueError(f"m and coefficients must fit in uint16, got m={modulus}, {coeffs!r}")
    proof = words.astype(">u2").tobytes()
    parse_proof(proof)  # an encoder must never emit what the parser rejects
    return proof


def encode_proofs(moduli: np.ndarray, coeffs: np.ndarray) -> list[bytes]:
    """Serialize many chunk proofs with the same k at once: proof i is m_i then coeffs[i].

    ``moduli``: ints ``[n]``; ``coeffs``: ints ``[n, k]``. Checks all rows with the
    parser's rules in a few array operations and raises what ``encode_proof`` would
    for the first bad row.
    """
    moduli = np.asarray(moduli, dtype=np.int64).reshape(-1)
    coeffs = np.asarray(coeffs, dtype=np.int64)
    if coeffs.ndim != 2 or coeffs.shape[0] != moduli.size:
        raise ValueError(
            f"need coeffs [n, k] for n = {moduli.size} moduli, got shape {coeffs.shape}"
        )
    n, k = coeffs.shape
    if n == 0:
        return []
    # The parser's rules (see _parse), so every proof emitted here parses.
    bad = (moduli < max(k, 1)) | (moduli > MAX_MODULUS) | (k == 0) | (coeffs < 0).any(axis=1)
    bad |= (coeffs >= P).any(axis=1)
    if bad.any():
        row = int(np.argmax(bad))
        encode_proof(int(moduli[row]), coeffs[row])  # raises, naming the field
    raw = np.concatenate((moduli[:, None], coeffs), axis=1).astype(">u2").tobytes()
    size = 2 * (k + 1)
    return [raw[start : start + size] for start in range(0, n * size, size)]


def parse_proof(
    proof: bytes | bytearray | memoryview, chunk: int | None = None
) -> tuple[int, np.ndarray]:
    """Validate one chunk proof and return ``(m, coeffs)`` (coeffs: int64, lowest degree first).

    Raises ``ProofFormatError`` when the length is not 2 + 2k with k >= 1, when m is 0
    (the reference's null proof) or above 65497, when m is smaller than k (no k indices
    can be distinct mod m, so no honest prover emits it), or when a coefficient is not
    an element of GF(65497). With ``chunk`` given, the message starts with "chunk N: ".
    """
    try:
        return _parse(proof)
    except ProofFormatError as error:
        if chunk is None:
            raise
        raise ProofFormatError(f"chunk {chunk}: {error}") from error


def _parse(proof: bytes | bytearray | memoryview) -> tuple[int, np.ndarray]:
    """``parse_proof`` without the chunk label."""
    if not isinstance(proof, (bytes, bytearray, memoryview)):
        raise ProofFormatError(f"a proof must be bytes, got {type(proof).__name__}")
    raw = bytes(proof)
    if len(raw) < 4 or len(raw) % 2:
        raise ProofFormatError(
            f"proof is {len(raw)} bytes; a proof is 2 + 2k bytes with k >= 1 (258 for topk=128)"
        )
    words = np.frombuffer(raw, dtype=">u2").astype(np.int64)
    modulus, coeffs = int(words[0]), words[1:]
    if modulus == 0:
        raise ProofFormatError("proof has m = 0 (a null proof): there is nothing to verify")
    if modulus > MAX_MODULUS:
        raise ProofFormatError(f"proof has m = {modulus}, above the maximum {MAX_MODULUS}")
    if modulus < coeffs.size:
        raise ProofFormatError(
            f"proof has m = {modulus} but {coeffs.size} points: "
            f"{coeffs.size} indices cannot be distinct mod {modulus}"
        )
    bad = np.flatnonzero(coeffs >= P)
    if bad.size:
        raise ProofFormatError(
            f"coefficient {int(bad[0])} is {int(coeffs[bad[0]])}, not below the field prime {P}"
        )
    return modulus, coeffs


def chunk_points(
    n_tokens: int, hidden_size: int, chunk_size: int = 32, topk: int = 128
) -> list[int]:
    """Number of points k' in each chunk's proof: min(topk, values in the chunk).

    Every chunk holds ``chunk_size`` rows of ``hidden_size`` values except possibly the
    last; there are ceil(n_tokens / chunk_size) chunks. Proof i has 2 + 2·k'_i bytes.
    """
    if n_tokens < 0 or hidden_size < 1 or chunk_size < 1 or topk < 1:
        raise ValueError(
            f"need n_tokens >= 0 and hidden_size, chunk_size, topk >= 1; got n_tokens="
            f"{n_tokens}, hidden_size={hidden_size}, chunk_size={chunk_size}, topk={topk}"
        )
    rows = [min(chunk_size, n_tokens - start) for start in range(0, n_tokens, chunk_size)]
    return [min(topk, r * hidden_size) for r in rows]


def proofs_to_bytes(proofs: list[bytes]) -> bytes:
    """Concatenate a sequence's chunk proofs into the rollout file's ``proofs`` value."""
    for i, proof in enumerate(proofs):
        parse_proof(proof, i)
    return b"".join(bytes(p) for p in proofs)


def bytes_to_proofs(
    data: bytes, *, n_tokens: int, hidden_size: int, chunk_size: int = 32, topk: int = 128
) -> list[bytes]:
    """Split a rollout's concatenated ``proofs`` value into validated chunk proofs.

    ``n_tokens`` is the number of generated tokens (rows proven), ``hidden_size`` the
    model's hidden size; with ``chunk_size`` and ``topk`` they fix every proof's length
    (see ``chunk_points``). Raises ``ProofFormatError`` if the total length is not the
    expected one or a piece is not a valid proof.
    """
    lengths = [2 + 2 * k for k in chunk_points(n_tokens, hidden_size, chunk_size, topk)]
    if len(data) != sum(lengths):
        raise ProofFormatError(
            f"proofs column is {len(data)} bytes; {n_tokens} tokens at hidden size "
            f"{hidden_size}, chunk size {chunk_size} and topk {topk} need {sum(lengths)} "
            f"({len(lengths)} chunk proofs)"
        )
    bounds = np.cumsum([0, *lengths])
    pieces = [bytes(data[a:b]) for a, b in itertools.pairwise(bounds)]
    for i, piece in enumerate(pieces):
        parse_proof(piece, i)
    return pieces
