"""Build and verify TOPLOC proofs of a sequence's final hidden states (DESIGN §4.3).

The proven tensor is the bf16 hidden state after the final norm, one row per
generated token. Rows are grouped in chunks of ``chunk_size`` (the last may be
shorter); per chunk, flattened row-major (index = t·hidden + h):

1. take the ``topk`` entries of largest |value|, chosen exactly as CPU
   ``torch.topk`` on the bf16 ``abs()`` does (that decides ties, which are common in
   bf16 and change the proof bytes; it is what the reference ``toploc`` 0.1.6 does);
2. y = the raw bf16 bits as uint16, reduced mod p = 65497;
3. m = the largest integer <= p with the chosen indices distinct mod m;
4. the proof is m and the coefficients of the polynomial f over GF(p), degree < k,
   with f(index mod m) = y (see ``encoding`` for the bytes).

Verification recomputes the verifier's own top-k of its activations, evaluates f at
(index mod m) and compares with the verifier's raw bits: bf16 exponent fields
``(b >> 7) & 0xFF`` must match, and over the entries whose exponents match, the mean
and upper median (``sorted(err)[n // 2]``) of |mantissa difference| (``b & 0x7F``)
must be small. The sign bit is not compared. If no exponent matches, mean and median
are both 2**64.

Deliberate difference from the reference: a chunk with fewer than ``topk`` values
(a tiny model's short last chunk) gets a proof with k' = its number of values
(2 + 2k' bytes) instead of the reference's silent null proof, and its mismatch
threshold is scaled by k'/topk.

Selection runs on the CPU (activations on another device are copied there first):
CUDA's topk breaks ties differently, and the vectors pin the CPU choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from swarmrl.toploc import gf
from swarmrl.toploc.encoding import ProofFormatError, chunk_points, encode_proof, parse_proof

# Chunks interpolated or evaluated per numpy call: the k x k temporaries of a few
# chunks stay in L2 cache; bigger batches were measured slower per chunk.
_CHUNKS_PER_CALL = 4

_NO_MATCH = float(2**64)  # the reference's statistic when no exponent matches


class ToplocThresholds(BaseModel):
    """When a chunk passes TOPLOC verification (paper's bf16 values by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_exp_mismatches: int = Field(
        38,
        ge=0,
        description="Most top-k entries (out of topk) whose bf16 exponent may differ from "
        "the proof; scaled by k'/topk for a chunk with only k' < topk values.",
    )
    max_mant_err_mean: float = Field(
        10.0,
        ge=0,
        description="Largest allowed mean |mantissa difference| (7-bit mantissa units) "
        "over entries whose exponents match.",
    )
    max_mant_err_median: float = Field(
        8.0,
        ge=0,
        description="Largest allowed upper median |mantissa difference| over entries whose "
        "exponents match.",
    )


@dataclass(frozen=True)
class ChunkCheck:
    """The verification statistics of one chunk and its verdict."""

    chunk: int  # chunk index in the sequence (chunk i covers rows i*chunk_size onward)
    n_points: int  # k' = points in this chunk's proof: min(topk, values in the chunk)
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    passed: bool


@dataclass(frozen=True)
class _TopEntries:
    """The selected entries of consecutive chunks that hold the same number of values."""

    first_chunk: int
    n_values: int  # values per chunk (chunk rows × hidden size)
    indices: np.ndarray  # int64 [chunks, k']: flat positions within each chunk
    bits: np.ndarray  # int64 [chunks, k']: raw bf16 bits (as uint16) at those positions


def build_proofs(activations: torch.Tensor, chunk_size: int = 32, topk: int = 128) -> list[bytes]:
    """Build one TOPLOC proof per chunk of ``chunk_size`` rows of ``activations``.

    ``activations``: bf16 ``[tokens, hidden]``. Returns ceil(tokens / chunk_size) proofs
    of 2 + 2·min(topk, values in the chunk) bytes each (258 for full chunks at topk=128).
    """
    proofs: list[bytes] = []
    for group in _top_entries(activations, chunk_size, topk):
        moduli = gf.injective_modulus(group.indices, group.n_values)
        points = group.indices % moduli[:, None]
        values = group.bits % gf.P
        coeffs = np.concatenate(
            [
                gf.interpolate(points[i : i + _CHUNKS_PER_CALL], values[i : i + _CHUNKS_PER_CALL])
                for i in range(0, len(points), _CHUNKS_PER_CALL)
            ]
        )
        proofs.extend(encode_proof(int(m), c) for m, c in zip(moduli, coeffs))
    return proofs


def verify_proofs(
    activations: torch.Tensor,
    proofs: list[bytes],
    chunk_size: int = 32,
    topk: int = 128,
    thresholds: ToplocThresholds = ToplocThresholds(),
) -> list[ChunkCheck]:
    """Check ``proofs`` against the verifier's own ``activations`` (bf16 ``[tokens, hidden]``).

    Returns one ``ChunkCheck`` per chunk; the sequence passes if every chunk passes.
    Raises ``ProofFormatError`` if a proof is malformed, the number of proofs is not
    ceil(tokens / chunk_size), or a proof's number of points is not the chunk's k'.
    """
    _check_layout(activations, chunk_size, topk)
    tokens, hidden = activations.shape
    expected_points = chunk_points(tokens, hidden, chunk_size, topk)
    if len(proofs) != len(expected_points):
        raise ProofFormatError(
            f"{len(proofs)} proofs for {tokens} tokens; chunks of {chunk_size} need "
            f"{len(expected_points)}"
        )
    parsed = []
    for i, (proof, k) in enumerate(zip(proofs, expected_points)):
        modulus, coeffs = parse_proof(proof, chunk=i)
        if coeffs.size != k:
            raise ProofFormatError(
                f"chunk {i}: proof has {coeffs.size} points, the chunk needs {k} "
                f"(min(topk={topk}, values in the chunk))"
            )
        parsed.append((modulus, coeffs))

    checks: list[ChunkCheck] = []
    for group in _top_entries(activations, chunk_size, topk):
        chunks = range(group.first_chunk, group.first_chunk + len(group.indices))
        moduli = np.array([parsed[c][0] for c in chunks], dtype=np.int64)
        coeffs = np.stack([parsed[c][1] for c in chunks])
        points = group.indices % moduli[:, None]
        claimed = np.concatenate(
            [
                gf.evaluate(coeffs[i : i + _CHUNKS_PER_CALL], points[i : i + _CHUNKS_PER_CALL])
                for i in range(0, len(points), _CHUNKS_PER_CALL)
            ]
        )
        checks.extend(_compare(claimed, group.bits, group.first_chunk, topk, thresholds))
    return checks


def _compare(
    claimed: np.ndarray,
    actual: np.ndarray,
    first_chunk: int,
    topk: int,
    thresholds: ToplocThresholds,
) -> list[ChunkCheck]:
    """Exponent mismatches and mantissa error statistics, one row per chunk."""
    n_points = claimed.shape[1]
    exp_match = ((claimed >> 7) & 0xFF) == ((actual >> 7) & 0xFF)
    mant_err = np.abs((claimed & 0x7F) - (actual & 0x7F))
    n_match = exp_match.sum(axis=1)
    err_sum = np.where(exp_match, mant_err, 0).sum(axis=1)
    # Non-matching entries sort after every real error (which is at most 127), so the
    # upper median of the matching ones sits at position n_match // 2.
    ordered = np.sort(np.where(exp_match, mant_err, 1 << 8), axis=1)
    median = ordered[np.arange(len(ordered)), np.minimum(n_match // 2, n_points - 1)]

    checks = []
    for row in range(len(claimed)):
        matched = int(n_match[row])
        mismatches = n_points - matched
        mean = int(err_sum[row]) / matched if matched else _NO_MATCH
        med = float(median[row]) if matched else _NO_MATCH
        # max_exp_mismatches is stated for topk points: compare mismatches/k' with
        # max/topk, in integers so the default case is exactly "<= 38".
        passed = (
            mismatches * topk <= thresholds.max_exp_mismatches * n_points
            and mean <= thresholds.max_mant_err_mean
            and med <= thresholds.max_mant_err_median
        )
        checks.append(ChunkCheck(first_chunk + row, n_points, mismatches, mean, med, passed))
    return checks


def _check_layout(activations: torch.Tensor, chunk_size: int, topk: int) -> None:
    """Reject inputs a proof is not defined for, with a message saying what to pass."""
    if not isinstance(activations, torch.Tensor):
        raise TypeError(f"activations must be a torch.Tensor, got {type(activations).__name__}")
    if activations.dtype != torch.bfloat16:
        raise TypeError(
            f"activations must be bf16 (proofs hash the bf16 bits), got {activations.dtype}"
        )
    if activations.dim() != 2 or activations.shape[1] == 0:
        raise ValueError(
            "activations must be [tokens, hidden] with hidden >= 1, "
            f"got shape {tuple(activations.shape)}"
        )
    if chunk_size < 1 or topk < 1 or topk > gf.MAX_POINTS:
        raise ValueError(
            f"need chunk_size >= 1 and 1 <= topk <= {gf.MAX_POINTS}; "
            f"got chunk_size={chunk_size}, topk={topk}"
        )


def _top_entries(activations: torch.Tensor, chunk_size: int, topk: int) -> list[_TopEntries]:
    """Per chunk, the top-|value| positions and their bits, grouped by chunk length."""
    _check_layout(activations, chunk_size, topk)
    bits = activations.detach().to("cpu").contiguous().view(torch.int16).numpy()
    tokens, hidden = bits.shape
    n_full = tokens // chunk_size
    groups = []
    if n_full:
        groups.append(_select(bits[: n_full * chunk_size].reshape(n_full, -1), 0, topk))
    if tokens % chunk_size:
        groups.append(_select(bits[n_full * chunk_size :].reshape(1, -1), n_full, topk))
    return groups


# bf16 bit patterns: clearing the sign gives the magnitude, whose integer order is the
# order of |value| for every non-NaN; 0x7F80 is infinity and above it are NaNs.
_MAGNITUDE_MASK = 0x7FFF
_ONE_NAN = 0x7F81


def _select(chunks: np.ndarray, first_chunk: int, topk: int) -> _TopEntries:
    """Top-k by |value| of each row of ``chunks`` (bf16 bits as int16 ``[n_chunks, values]``).

    Picks exactly what ``torch.topk(chunk.abs(), k)`` on the bf16 chunk picks (the
    reference's choice): the same CPU top-k runs on int16 magnitudes, whose
    comparisons give the same answers as torch's bf16 comparator once every NaN is
    mapped to one value above infinity (torch treats NaNs as equal to each other and
    larger than any number). Same answers, same comparison sequence, same ties.
    Computing |value| in numpy rather than torch keeps torch's thread pool out of it:
    on a busy 2-core machine a parallel ``abs()`` left spinning threads that made the
    following top-k 20x slower. For the same reason each chunk gets its own (serial)
    top-k call: a batched call runs rows on torch's thread pool, which was 1.6x slower
    per chunk than the loop on that machine; the loop costs microseconds per chunk.
    """
    n_values = chunks.shape[1]
    k = min(topk, n_values)
    magnitude = torch.from_numpy(np.minimum(chunks & _MAGNITUDE_MASK, _ONE_NAN))
    indices = np.stack([row.topk(k).indices.numpy() for row in magnitude])
    return _TopEntries(
        first_chunk=first_chunk,
        n_values=n_values,
        indices=indices.astype(np.int64),
        bits=np.take_along_axis(chunks, indices, axis=1).view(np.uint16).astype(np.int64),
    )
