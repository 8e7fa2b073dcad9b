"""Build and verify TOPLOC proofs of a sequence's final hidden states (docs/architecture.md §4.3).

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

``build_proofs_batch`` and ``verify_proofs_batch`` take many sequences at once (a
rollout file's): chunks of equal length, from every sequence, share one top-k call and
one interpolation (or evaluation) pass, and the per-call overhead is paid once per
file instead of once per sequence. ``build_proofs`` and ``verify_proofs`` are the
one-sequence case of the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from swarmrl.toploc import gf
from swarmrl.toploc.encoding import (
    ProofFormatError,
    chunk_points,
    encode_proofs,
    parse_proof,
    proofs_to_bytes,
)
from swarmrl.toploc.thresholds import PAPER_THRESHOLDS, ToplocThresholds

_Item = TypeVar("_Item")

_NO_MATCH = float(2**64)  # the reference's statistic when no exponent matches


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
    """The selected entries of chunks (from any sequences) that hold the same number of values."""

    sequences: np.ndarray  # int64 [chunks]: position of each chunk's sequence in the batch
    chunks: np.ndarray  # int64 [chunks]: each chunk's index within its sequence
    n_values: int  # values per chunk (chunk rows × hidden size)
    indices: np.ndarray  # int64 [chunks, k']: flat positions within each chunk
    bits: np.ndarray  # int64 [chunks, k']: raw bf16 bits (as uint16) at those positions


# The paper's bf16 thresholds: the default for a verifier given none.


def build_proofs(activations: torch.Tensor, chunk_size: int = 32, topk: int = 128) -> list[bytes]:
    """Build one TOPLOC proof per chunk of ``chunk_size`` rows of ``activations``.

    ``activations``: bf16 ``[tokens, hidden]``. Returns ceil(tokens / chunk_size) proofs
    of 2 + 2·min(topk, values in the chunk) bytes each (258 for full chunks at topk=128).
    """
    return build_proofs_batch([activations], chunk_size, topk)[0]


def build_proofs_batch(
    activations: Sequence[torch.Tensor], chunk_size: int = 32, topk: int = 128
) -> list[list[bytes]]:
    """``build_proofs`` for many sequences at once: one list of chunk proofs per sequence.

    Byte-identical to ``[build_proofs(a, chunk_size, topk) for a in activations]``, at a
    fraction of the cost: all chunks of equal length share one top-k call, and all
    chunks with the same number of points share the modulus search, the interpolation
    and the encoding. Sequences may differ in length and hidden size.
    """
    placed: list[tuple[int, int, bytes]] = []
    for groups in _by_points(activations, chunk_size, topk):
        moduli = np.concatenate([gf.injective_modulus(g.indices, g.n_values) for g in groups])
        indices = np.concatenate([g.indices for g in groups])
        values = np.concatenate([g.bits % gf.P for g in groups])
        encoded = encode_proofs(moduli, gf.interpolate(indices % moduli[:, None], values))
        sequences = np.concatenate([g.sequences for g in groups]).tolist()
        chunks = np.concatenate([g.chunks for g in groups]).tolist()
        placed.extend(zip(sequences, chunks, encoded, strict=True))
    return _per_sequence(len(activations), placed)


def proof_column(states: Sequence[torch.Tensor]) -> list[bytes]:
    """The ``proofs`` values of a rollout file: each sequence's chunk proofs, joined.

    One batched call for the whole file: several times cheaper than per sequence.
    """
    return [proofs_to_bytes(chunks) for chunks in build_proofs_batch(states)]


def verify_proofs(
    activations: torch.Tensor,
    proofs: list[bytes],
    chunk_size: int = 32,
    topk: int = 128,
    thresholds: ToplocThresholds = PAPER_THRESHOLDS,
) -> list[ChunkCheck]:
    """Check ``proofs`` against the verifier's own ``activations`` (bf16 ``[tokens, hidden]``).

    Returns one ``ChunkCheck`` per chunk; the sequence passes if every chunk passes.
    Raises ``ProofFormatError`` if a proof is malformed, the number of proofs is not
    ceil(tokens / chunk_size), or a proof's number of points is not the chunk's k'.
    """
    _check_layout(activations, chunk_size, topk)
    parsed = _parse_sequence(activations, proofs, chunk_size, topk)
    return _verify_parsed([activations], [parsed], chunk_size, topk, thresholds)[0]


def verify_proofs_batch(
    activations: Sequence[torch.Tensor],
    proofs: Sequence[list[bytes]],
    chunk_size: int = 32,
    topk: int = 128,
    thresholds: ToplocThresholds = PAPER_THRESHOLDS,
) -> list[list[ChunkCheck]]:
    """``verify_proofs`` for many sequences at once: one list of ``ChunkCheck`` per sequence.

    Same results as ``[verify_proofs(a, p, ...) for a, p in zip(activations, proofs)]``,
    with one top-k call per chunk length and one evaluation pass per number of points.
    A ``ProofFormatError`` names the sequence: "sequence i: chunk j: ...".
    """
    if len(activations) != len(proofs):
        raise ValueError(f"{len(activations)} activations but {len(proofs)} proof lists")
    parsed = []
    for i, (sequence, sequence_proofs) in enumerate(zip(activations, proofs, strict=True)):
        _check_layout(sequence, chunk_size, topk)
        try:
            parsed.append(_parse_sequence(sequence, sequence_proofs, chunk_size, topk))
        except ProofFormatError as error:
            raise ProofFormatError(f"sequence {i}: {error}") from error
    return _verify_parsed(activations, parsed, chunk_size, topk, thresholds)


def _parse_sequence(
    activations: torch.Tensor, proofs: list[bytes], chunk_size: int, topk: int
) -> list[tuple[int, np.ndarray]]:
    """Parse one sequence's proofs, checking their count and each one's number of points."""
    tokens, hidden = activations.shape
    expected_points = chunk_points(tokens, hidden, chunk_size, topk)
    if len(proofs) != len(expected_points):
        raise ProofFormatError(
            f"{len(proofs)} proofs for {tokens} tokens; chunks of {chunk_size} need "
            f"{len(expected_points)}"
        )
    parsed = []
    for i, (proof, k) in enumerate(zip(proofs, expected_points, strict=True)):
        modulus, coeffs = parse_proof(proof, chunk=i)
        if coeffs.size != k:
            raise ProofFormatError(
                f"chunk {i}: proof has {coeffs.size} points, the chunk needs {k} "
                f"(min(topk={topk}, values in the chunk))"
            )
        parsed.append((modulus, coeffs))
    return parsed


def _verify_parsed(
    activations: Sequence[torch.Tensor],
    parsed: list[list[tuple[int, np.ndarray]]],
    chunk_size: int,
    topk: int,
    thresholds: ToplocThresholds,
) -> list[list[ChunkCheck]]:
    """Compare parsed proofs with the verifier's own top-k entries, all sequences at once."""
    placed: list[tuple[int, int, ChunkCheck]] = []
    for groups in _by_points(activations, chunk_size, topk):
        chunks = np.concatenate([g.chunks for g in groups])
        owners = list(
            zip(
                np.concatenate([g.sequences for g in groups]).tolist(), chunks.tolist(), strict=True
            )
        )
        moduli = np.array([parsed[s][c][0] for s, c in owners], dtype=np.int64)
        coeffs = np.stack([parsed[s][c][1] for s, c in owners])
        indices = np.concatenate([g.indices for g in groups])
        claimed = gf.evaluate(coeffs, indices % moduli[:, None])
        actual = np.concatenate([g.bits for g in groups])
        found = _compare(claimed, actual, chunks, topk, thresholds)
        placed.extend((s, c, check) for (s, c), check in zip(owners, found, strict=True))
    return _per_sequence(len(activations), placed)


def _by_points(
    activations: Sequence[torch.Tensor], chunk_size: int, topk: int
) -> list[list[_TopEntries]]:
    """The top-k entries of every chunk, grouped by number of points k' (chunks with
    the same k' share one modulus search, interpolation or evaluation pass)."""
    groups: dict[int, list[_TopEntries]] = {}
    for group in _top_entries(activations, chunk_size, topk):
        groups.setdefault(group.indices.shape[1], []).append(group)
    return list(groups.values())


def _per_sequence(n: int, placed: Sequence[tuple[int, int, _Item]]) -> list[list[_Item]]:
    """(sequence, chunk, item) triples into one list per sequence, in chunk order."""
    out: list[list[_Item]] = [[] for _ in range(n)]
    for sequence, _, item in sorted(placed, key=lambda entry: entry[:2]):
        out[sequence].append(item)
    return out


def _compare(
    claimed: np.ndarray,
    actual: np.ndarray,
    chunks: np.ndarray,
    topk: int,
    thresholds: ToplocThresholds,
) -> list[ChunkCheck]:
    """Exponent mismatches and mantissa error statistics, one row per chunk.

    ``chunks`` holds each row's chunk index within its sequence.
    """
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
        checks.append(ChunkCheck(int(chunks[row]), n_points, mismatches, mean, med, passed))
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


def _top_entries(
    activations: Sequence[torch.Tensor], chunk_size: int, topk: int
) -> list[_TopEntries]:
    """Per chunk of every sequence, the top-|value| positions and their bits, grouped by
    chunk length (full chunks of one hidden size together, short last chunks by size)."""
    by_hidden: dict[int, list[int]] = {}
    for sequence, tensor in enumerate(activations):
        _check_layout(tensor, chunk_size, topk)
        by_hidden.setdefault(tensor.shape[1], []).append(sequence)
    groups = []
    for members in by_hidden.values():
        tensors = [activations[i] for i in members]
        groups.extend(_same_width_entries(tensors, np.array(members), chunk_size, topk))
    return groups


def _same_width_entries(
    tensors: list[torch.Tensor], sequences: np.ndarray, chunk_size: int, topk: int
) -> list[_TopEntries]:
    """``_top_entries`` for sequences of one hidden size, stacked into one array of rows.

    One conversion and one magnitude pass for all sequences; each group of equal-length
    chunks is then a row gather (or a view, for a lone chunk) of the stacked magnitudes.
    """
    bits = torch.cat([t.detach().cpu() for t in tensors]).view(torch.int16).numpy()
    hidden = bits.shape[1]
    magnitude = _magnitude(bits)
    lengths = np.array([len(t) for t in tensors])
    starts = np.cumsum(lengths) - lengths
    n_full, tail = lengths // chunk_size, lengths % chunk_size

    # (rows per chunk, position in `tensors`, chunk index, first row) of each group.
    owner = np.repeat(np.arange(len(tensors)), n_full)
    index = np.arange(len(owner)) - np.repeat(np.cumsum(n_full) - n_full, n_full)
    layout = [(chunk_size, owner, index, starts[owner] + index * chunk_size)] if len(owner) else []
    for rows in np.unique(tail[tail > 0]).tolist():
        owner = np.flatnonzero(tail == rows)
        layout.append((rows, owner, n_full[owner], starts[owner] + n_full[owner] * chunk_size))

    groups = []
    for rows, owner, index, first_row in layout:
        if len(first_row) == 1:
            chunks = magnitude[first_row[0] : first_row[0] + rows].reshape(1, -1)
        else:
            chunks = magnitude[first_row[:, None] + np.arange(rows)].reshape(len(first_row), -1)
        indices = _select(chunks, topk)
        positions = first_row[:, None] * hidden + indices  # into the flattened rows
        groups.append(
            _TopEntries(
                sequences=sequences[owner],
                chunks=index,
                n_values=rows * hidden,
                indices=indices,
                bits=bits.reshape(-1)[positions].view(np.uint16).astype(np.int64),
            )
        )
    return groups


# bf16 bit patterns: clearing the sign gives the magnitude, whose integer order is the
# order of |value| for every non-NaN; 0x7F80 is infinity and above it are NaNs.
_MAGNITUDE_MASK = 0x7FFF
_ONE_NAN = 0x7F81


def _magnitude(bits: np.ndarray) -> np.ndarray:
    """int16 keys whose order is torch's order of the bf16 |values| (``bits``: int16).

    Clearing the sign gives |value|'s bits; every NaN maps to one value above infinity,
    because torch's comparator treats NaNs as equal to each other and larger than any
    number. Computed in numpy rather than torch to keep torch's thread pool out of it:
    on a busy 2-core machine a parallel ``abs()`` left spinning threads that made the
    following top-k 20x slower.
    """
    magnitude = bits & _MAGNITUDE_MASK
    return np.minimum(magnitude, _ONE_NAN, out=magnitude)


def _select(magnitude: np.ndarray, topk: int) -> np.ndarray:
    """Top-k positions in each row of ``magnitude`` (``_magnitude`` keys, ``[n, values]``).

    Picks exactly the set ``torch.topk(chunk.abs(), k)`` on each bf16 chunk picks (the
    reference's choice): the same CPU top-k runs on keys whose comparisons give the
    same answers as torch's bf16 comparator. Same answers, same comparison sequence,
    same ties. A proof depends on the set only, not its order, so the top-k skips its
    final sort (``sorted=False`` leaves the selection itself unchanged), and a chunk of
    exactly k values takes all of them. One batched call covers all rows: each row gets
    the same serial selection as a call of its own. With more than one torch thread the
    call spreads rows over the pool; the inference worker runs with one.
    """
    n_chunks, n_values = magnitude.shape
    k = min(topk, n_values)
    if k == n_values:
        return np.broadcast_to(np.arange(n_values, dtype=np.int64), (n_chunks, n_values)).copy()
    return torch.from_numpy(magnitude).topk(k, dim=1, sorted=False).indices.numpy()
