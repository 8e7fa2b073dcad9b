"""Tests for swarmrl.toploc: reference vectors, properties, tampering and bad proof bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmrl.toploc import (
    ChunkCheck,
    ProofFormatError,
    ToplocThresholds,
    build_proofs,
    build_proofs_batch,
    bytes_to_proofs,
    chunk_points,
    encode_proof,
    encode_proofs,
    gf,
    parse_proof,
    proofs_to_bytes,
    verify_proofs,
    verify_proofs_batch,
)

# The reference toploc 0.1.6 package's public test vectors, kept as published.
VECTOR_DIR = Path(__file__).resolve().parent / "data" / "toploc"
P = 65497


def _load_cases() -> list[dict]:
    files = [VECTOR_DIR / "public_vectors.json", VECTOR_DIR / "public_collisions.json.gz"]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        # The vectors are the byte-compatibility oracle: their absence is a failure.
        pytest.fail(f"TOPLOC test vectors missing: {missing}; they belong in tests/data/toploc/")
    cases = []
    for f in files:
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as handle:
            cases.extend(json.load(handle))
    return cases


def _bf16(hex_bits: str, tokens: int, hidden: int) -> torch.Tensor:
    """Activations from the vectors' hex: little-endian uint16 bf16 bit patterns."""
    bits = np.frombuffer(bytes.fromhex(hex_bits), dtype="<u2").view(np.int16)
    return torch.from_numpy(bits.reshape(tokens, hidden).copy()).view(torch.bfloat16)


def _from_bits(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)


CASES = _load_cases() if VECTOR_DIR.exists() else []


def test_vectors_present() -> None:
    assert len(_load_cases()) >= 8


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c['seed']}-{c['perturb']}")
def test_reference_vectors(case: dict) -> None:
    """Proof bytes and verification statistics equal the reference toploc 0.1.6's, exactly."""
    shape = (case["T"], case["H"])
    ours = build_proofs(_bf16(case["act_bits"], *shape), case["chunk"], case["topk"])
    assert [p.hex() for p in ours] == case["proofs"]

    reference_proofs = [bytes.fromhex(p) for p in case["proofs"]]
    checks = verify_proofs(
        _bf16(case["other_bits"], *shape), reference_proofs, case["chunk"], case["topk"]
    )
    assert [(c.exp_mismatches, c.mant_err_mean, c.mant_err_median) for c in checks] == [
        (v["exp_mismatches"], v["mant_err_mean"], v["mant_err_median"]) for v in case["verify"]
    ]
    assert [c.chunk for c in checks] == list(range(len(checks)))
    for check in checks:
        expected = (
            check.exp_mismatches <= 38 and check.mant_err_mean <= 10 and check.mant_err_median <= 8
        )
        assert check.passed == expected


def _verify_stats(checks: list[ChunkCheck]) -> list[tuple[int, float, float]]:
    return [(c.exp_mismatches, c.mant_err_mean, c.mant_err_median) for c in checks]


def test_reference_vectors_in_one_batch() -> None:
    """All cases sharing chunk size and topk in one batched call: the reference's bytes and
    statistics, whatever else is in the batch (hidden sizes 8 to 4096 mixed)."""
    by_layout: dict[tuple[int, int], list[dict]] = {}
    for case in CASES:
        by_layout.setdefault((case["chunk"], case["topk"]), []).append(case)
    for (chunk, topk), cases in by_layout.items():
        ours = build_proofs_batch(
            [_bf16(c["act_bits"], c["T"], c["H"]) for c in cases], chunk, topk
        )
        assert [[p.hex() for p in proofs] for proofs in ours] == [c["proofs"] for c in cases]
        checks = verify_proofs_batch(
            [_bf16(c["other_bits"], c["T"], c["H"]) for c in cases],
            [[bytes.fromhex(p) for p in c["proofs"]] for c in cases],
            chunk,
            topk,
        )
        assert [_verify_stats(seq) for seq in checks] == [
            [(v["exp_mismatches"], v["mant_err_mean"], v["mant_err_median"]) for v in c["verify"]]
            for c in cases
        ]


# --- an independent, slow oracle: docs/architecture.md §4.3 in plain Python ----------------


def _oracle_proof(chunk: torch.Tensor, topk: int) -> bytes:
    flat = chunk.reshape(-1)
    k = min(topk, flat.numel())
    indices = flat.abs().topk(k).indices.tolist()
    bits = flat.view(torch.int16).numpy().view(np.uint16)
    ys = [int(bits[i]) % P for i in indices]
    m = next(m for m in range(P, 0, -1) if len({i % m for i in indices}) == k)
    xs = [i % m for i in indices]
    coeffs = [0] * k  # Lagrange: sum_j y_j prod_{i != j} (x - x_i) / (x_j - x_i)
    for j in range(k):
        basis, denominator = [1], 1
        for i in range(k):
            if i != j:
                basis = [(a - xs[i] * b) % P for a, b in zip([0, *basis], [*basis, 0], strict=True)]
                denominator = denominator * (xs[j] - xs[i]) % P
        scale = ys[j] * pow(denominator, P - 2, P) % P
        coeffs = [(c + scale * b) % P for c, b in zip(coeffs, basis, strict=True)]
    return b"".join(v.to_bytes(2, "big") for v in [m, *coeffs])


@st.composite
def activations(draw, max_tokens: int = 70, max_hidden: int = 24, finite: bool = True):
    """bf16 [tokens, hidden] with many exact ties (few distinct magnitudes) or spread values."""
    tokens = draw(st.integers(1, max_tokens))
    hidden = draw(st.integers(1, max_hidden))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        palette = rng.integers(0, 1 << 16, size=draw(st.integers(1, 6)))
        bits = rng.choice(palette, size=(tokens, hidden))
        bits ^= rng.integers(0, 2, size=bits.shape) << 15  # random signs: ties in |value|
    else:
        bits = rng.integers(0, 1 << 16, size=(tokens, hidden))
    if finite:
        # Exponent 0xFF is inf/NaN; a NaN's bits can exceed p and so not survive mod p.
        special = ((bits >> 7) & 0xFF) == 0xFF
        bits[special] &= ~(1 << 14)
    return _from_bits(bits)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=activations(finite=False), chunk_size=st.integers(1, 40), topk=st.integers(1, 12))
def test_matches_plain_python_oracle(x: torch.Tensor, chunk_size: int, topk: int) -> None:
    """Same bytes as the definition run naively, ties and NaNs included (torch.topk's choice)."""
    expected = [
        _oracle_proof(x[start : start + chunk_size], topk) for start in range(0, len(x), chunk_size)
    ]
    assert build_proofs(x, chunk_size, topk) == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=activations(max_tokens=100, max_hidden=300),
    chunk_size=st.integers(1, 40),
    topk=st.sampled_from([1, 7, 64, 128]),
)
def test_honest_proofs_verify_exactly_and_round_trip(
    x: torch.Tensor, chunk_size: int, topk: int
) -> None:
    tokens, hidden = x.shape
    proofs = build_proofs(x, chunk_size, topk)
    points = chunk_points(tokens, hidden, chunk_size, topk)
    assert [len(p) for p in proofs] == [2 + 2 * k for k in points]
    assert len(proofs) == -(-tokens // chunk_size)

    checks = verify_proofs(x, proofs, chunk_size, topk)
    assert all(c.exp_mismatches == 0 for c in checks)
    assert all(c.mant_err_mean == 0 and c.mant_err_median == 0 and c.passed for c in checks)
    assert [c.n_points for c in checks] == points

    column = proofs_to_bytes(proofs)
    assert len(column) == sum(len(p) for p in proofs)
    split = bytes_to_proofs(
        column, n_tokens=tokens, hidden_size=hidden, chunk_size=chunk_size, topk=topk
    )
    assert split == proofs
    assert [encode_proof(*parse_proof(p)) for p in proofs] == proofs


def _chunk_by_chunk_proofs(x: torch.Tensor, chunk_size: int = 32, topk: int = 128) -> list[bytes]:
    """The definition one chunk at a time: torch's own top-k of the bf16 |values| (sorted,
    as the reference calls it) and the Lagrange interpolation path, whatever the domain."""
    proofs = []
    for start in range(0, len(x), chunk_size):
        flat = x[start : start + chunk_size].reshape(-1)
        indices = flat.abs().topk(min(topk, flat.numel())).indices.numpy()[None, :]
        values = flat.view(torch.int16).numpy().view(np.uint16)[indices].astype(np.int64) % P
        [modulus] = gf.injective_modulus(indices, flat.numel())
        [coeffs] = gf._interpolate_lagrange(indices % modulus, values)
        proofs.append(encode_proof(int(modulus), coeffs))
    return proofs


def _rollout_like(hidden: int, lengths: list[int], seed: int) -> list[torch.Tensor]:
    """Sequences of the given lengths, alternately Gaussian and heavily tied (4 magnitudes)."""
    rng = np.random.default_rng(seed)
    sequences = []
    for i, tokens in enumerate(lengths):
        if i % 2:
            palette = np.array([0x3F80, 0x4000, 0x4040, 0x3F00])  # 1, 2, 3, 0.5
            bits = rng.choice(palette, size=(tokens, hidden)) | (
                rng.integers(0, 2, size=(tokens, hidden)) << 15
            )
            sequences.append(_from_bits(bits))
        else:
            gaussian = rng.standard_normal((tokens, hidden))
            sequences.append(torch.from_numpy(gaussian).to(torch.bfloat16))
    return sequences


@pytest.mark.parametrize(
    ("hidden", "lengths"),
    [
        (2, [70, 33, 1, 64, 0, 5]),  # every chunk has fewer than topk values
        (128, [30, 48, 32, 33, 1, 0, 47, 64, 3, 31]),  # the default model's rollouts
        (896, [40, 32, 7, 65]),
        (4096, [33, 32]),  # above 65497 values: the modulus search runs
    ],
)
def test_batch_matches_the_definition_chunk_by_chunk(hidden: int, lengths: list[int]) -> None:
    """Batched selection (one unsorted top-k per chunk length) and the table interpolation
    give the bytes of the definition, ties and short last chunks included."""
    sequences = _rollout_like(hidden, lengths, seed=hidden)
    batch = build_proofs_batch(sequences)
    assert batch == [_chunk_by_chunk_proofs(x) for x in sequences]
    assert [build_proofs(x) for x in sequences] == batch
    checks = verify_proofs_batch(sequences, batch)
    assert checks == [verify_proofs(x, p) for x, p in zip(sequences, batch, strict=True)]
    assert all(c.passed and c.exp_mismatches == 0 for seq in checks for c in seq)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    xs=st.lists(activations(max_tokens=40, max_hidden=40), max_size=5),
    chunk_size=st.integers(1, 12),
    topk=st.sampled_from([1, 5, 16, 128]),
)
def test_batch_of_mixed_shapes_matches_the_definition(
    xs: list[torch.Tensor], chunk_size: int, topk: int
) -> None:
    assert build_proofs_batch(xs, chunk_size, topk) == [
        _chunk_by_chunk_proofs(x, chunk_size, topk) for x in xs
    ]


def test_verify_batch_names_the_sequence_of_a_bad_proof() -> None:
    x = _hidden_states()
    proofs = build_proofs(x)
    with pytest.raises(ProofFormatError, match="sequence 1: 1 proofs for 64 tokens"):
        verify_proofs_batch([x, x], [proofs, proofs[:1]])
    with pytest.raises(ProofFormatError, match="sequence 0: chunk 1: proof has m = 0"):
        verify_proofs_batch([x], [[proofs[0], _proof(0, [0] * 128)]])
    with pytest.raises(ValueError, match="2 activations but 1 proof lists"):
        verify_proofs_batch([x, x], [proofs])
    assert build_proofs_batch([]) == [] and verify_proofs_batch([], []) == []


def test_full_size_chunk_verifies_and_uses_default_layout() -> None:
    x = torch.randn(70, 896, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    proofs = build_proofs(x)
    assert [len(p) for p in proofs] == [258, 258, 258]
    assert all(c.passed and c.exp_mismatches == 0 for c in verify_proofs(x, proofs))


# --- the field arithmetic on its own ---------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 160), seed=st.integers(0, 2**32 - 1), near_top=st.booleans())
def test_interpolate_then_evaluate_recovers_points(k: int, seed: int, near_top: bool) -> None:
    rng = np.random.default_rng(seed)
    # near_top puts x among the fixed evaluation points P-1, P-2, ... (a special case).
    pool = np.arange(P - 2 * k, P) if near_top else np.arange(P)
    x = np.stack([rng.choice(pool, size=k, replace=False) for _ in range(2)])
    y = rng.integers(0, P, size=(2, k))
    coeffs = gf.interpolate(x, y)
    assert coeffs.shape == (2, k) and coeffs.min() >= 0 and coeffs.max() < P
    assert (gf.evaluate(coeffs, x) == y).all()
    assert (gf.evaluate(coeffs, np.zeros((2, 1), dtype=np.int64))[:, 0] == coeffs[:, 0]).all()


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 256),
    domain=st.sampled_from([1, 300, 4096, gf.SMALL_DOMAIN]),
    seed=st.integers(0, 2**32 - 1),
)
def test_table_interpolation_agrees_with_lagrange(k: int, domain: int, seed: int) -> None:
    """Points below SMALL_DOMAIN take the table path; it gives the Lagrange path's answer."""
    rng = np.random.default_rng(seed)
    x = np.stack([rng.choice(max(k, domain), size=k, replace=False) for _ in range(3)])
    y = rng.integers(0, P, size=(3, k))
    y[0] = P - 1  # the largest values: the products' exactness bound
    assert gf._in_tables(x, k)
    coeffs = gf.interpolate(x, y)
    assert (coeffs == gf._interpolate_lagrange(x, y)).all()
    assert (gf.evaluate(coeffs, x) == y).all()
    zero = np.zeros((3, 1), dtype=np.int64)
    assert (gf.evaluate(coeffs, zero)[:, 0] == coeffs[:, 0]).all()


def test_log_tables_are_a_bijection() -> None:
    assert sorted(gf.EXP.tolist()) == list(range(1, P))
    assert (gf.LOG[gf.EXP] == np.arange(P - 1)).all()
    a = np.arange(1, P)
    assert (a * gf.inverse(a) % P == 1).all()


def test_injective_modulus_steps_below_p_only_on_collision() -> None:
    distinct = np.array([[0, 5, 65496]])
    assert gf.injective_modulus(distinct, n_values=65497).tolist() == [P]
    assert gf.injective_modulus(distinct, n_values=131072).tolist() == [P]
    # 0 and 65497 collide mod p; mod 65496 they are 0 and 1.
    assert gf.injective_modulus(np.array([[0, 65497, 7]]), n_values=131072).tolist() == [65496]
    # 0, 65497 and 130992 = 2*65496 collide mod p (0, 0, 1), mod 65496 (0, 1, 0) and
    # mod 65495 (0, 2, 2); mod 65494 they are 0, 3, 4.
    assert gf.injective_modulus(np.array([[0, 65497, 130992]]), 131072).tolist() == [65494]


def test_injective_modulus_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    indices = np.stack([rng.choice(40 * P, size=128, replace=False) for _ in range(12)])
    expected = [
        next(m for m in range(P, 0, -1) if len(set((row % m).tolist())) == 128) for row in indices
    ]
    assert gf.injective_modulus(indices, 40 * P).tolist() == expected


# --- tampering is caught ----------------------------------------------------------------


def _hidden_states(tokens: int = 64, hidden: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed)).to(
        torch.bfloat16
    )


def test_errors_grow_with_noise_and_large_noise_fails() -> None:
    x = _hidden_states()
    proofs = build_proofs(x)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    means, mismatches = [], []
    for scale in (0.0, 0.01, 0.05, 0.5):
        checks = verify_proofs((x.float() + scale * noise).to(torch.bfloat16), proofs)
        mismatches.append(sum(c.exp_mismatches for c in checks))
        means.append(sum(c.mant_err_mean for c in checks))
        if scale == 0.0:
            assert all(c.passed for c in checks)
        if scale == 0.5:
            assert not any(c.passed for c in checks)
    assert means == sorted(means) and means[0] == 0 < means[1]
    assert mismatches == sorted(mismatches) and mismatches[-1] > 0


def test_other_activations_fail() -> None:
    proofs = build_proofs(_hidden_states(seed=0))
    checks = verify_proofs(_hidden_states(seed=1), proofs)
    assert not any(c.passed for c in checks)


def test_rescaled_activations_fail_on_mantissa() -> None:
    x = _hidden_states()
    checks = verify_proofs((x.float() * 1.1).to(torch.bfloat16), build_proofs(x))
    assert not any(c.passed for c in checks)
    assert all(c.mant_err_mean > 10 for c in checks)


def test_no_matching_exponent_reports_two_to_the_64() -> None:
    x = _hidden_states(tokens=32)
    # x * 4 has every exponent 2 higher and the same mantissas and top-k positions.
    checks = verify_proofs((x.float() * 4).to(torch.bfloat16), build_proofs(x))
    assert checks == [ChunkCheck(0, 128, 128, float(2**64), float(2**64), False)]


def test_thresholds_are_configurable() -> None:
    x = _hidden_states()
    y = (x.float() * 1.1).to(torch.bfloat16)
    lenient = ToplocThresholds(max_mant_err_mean=64, max_mant_err_median=64, max_exp_mismatches=128)
    assert all(c.passed for c in verify_proofs(y, build_proofs(x), thresholds=lenient))
    with pytest.raises(ValueError):
        ToplocThresholds(max_exp_mismatches=-1)


# --- short chunks -----------------------------------------------------------------------


def test_short_chunks_get_shorter_proofs() -> None:
    """Fewer than topk values: k' = all of them (the reference would emit a null proof)."""
    x = _hidden_states(tokens=33, hidden=2)
    proofs = build_proofs(x)
    assert [len(p) for p in proofs] == [2 + 2 * 64, 2 + 2 * 2]
    assert chunk_points(33, 2) == [64, 2]
    assert [(c.n_points, c.passed) for c in verify_proofs(x, proofs)] == [(64, True), (2, True)]


@pytest.mark.parametrize(("flipped", "passes"), [(19, True), (20, False)])
def test_short_chunk_mismatch_threshold_scales(flipped: int, passes: bool) -> None:
    """k' = 64 of topk = 128: the 38-mismatch limit becomes 19."""
    x = _hidden_states(tokens=32, hidden=2)
    y = x.clone().reshape(-1)
    y[:flipped] = y[:flipped] * 2  # exponent + 1, same mantissa; k' covers every value
    [check] = verify_proofs(y.reshape(32, 2), build_proofs(x))
    assert (check.exp_mismatches, check.mant_err_mean, check.passed) == (flipped, 0.0, passes)


def test_empty_sequence_has_no_proofs() -> None:
    x = torch.zeros(0, 16, dtype=torch.bfloat16)
    assert build_proofs(x) == [] and verify_proofs(x, []) == []
    assert bytes_to_proofs(b"", n_tokens=0, hidden_size=16) == []


# --- malformed input --------------------------------------------------------------------


def _proof(m: int, coeffs: list[int]) -> bytes:
    return b"".join(v.to_bytes(2, "big") for v in [m, *coeffs])


@pytest.mark.parametrize(
    ("proof", "message"),
    [
        (b"", "0 bytes"),
        (b"\xff\xd9", "2 bytes"),
        (_proof(P, [1, 2])[:-1], "5 bytes"),
        (_proof(P, [1] * 128)[:257], "257 bytes"),
        (_proof(0, [1] * 128), "m = 0"),
        (_proof(P + 1, [1] * 128), "m = 65498"),
        (_proof(0xFFFF, [1] * 128), "m = 65535"),
        (_proof(P, [1] * 127 + [P]), "coefficient 127 is 65497"),
        (_proof(P, [0xFFFF, 0]), "coefficient 0 is 65535"),
        (_proof(3, [1, 2, 3, 4]), "cannot be distinct mod 3"),
    ],
)
def test_malformed_proofs_are_rejected_with_the_reason(proof: bytes, message: str) -> None:
    with pytest.raises(ProofFormatError, match=message):
        parse_proof(proof)
    with pytest.raises(ProofFormatError, match="chunk 0"):
        proofs_to_bytes([proof])


def test_proof_must_be_bytes() -> None:
    with pytest.raises(ProofFormatError, match="must be bytes"):
        parse_proof("ffd9" * 129)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_parse_or_raise_format_error(raw: bytes) -> None:
    try:
        m, coeffs = parse_proof(raw)
    except ProofFormatError:
        return
    assert len(raw) == 2 + 2 * len(coeffs) and 1 <= m <= P and (coeffs < P).all()


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(min_size=0, max_size=300), k=st.integers(1, 128))
def test_verify_with_random_proof_bytes_never_crashes(raw: bytes, k: int) -> None:
    x = _hidden_states(tokens=32, hidden=8)
    candidate = raw[: 2 + 2 * k] if len(raw) >= 2 + 2 * k else raw
    try:
        [check] = verify_proofs(x, [candidate], topk=k)
    except ProofFormatError:
        return
    assert 0 <= check.exp_mismatches <= k


def test_verify_rejects_wrong_proof_count_and_size() -> None:
    x = _hidden_states()
    proofs = build_proofs(x)
    with pytest.raises(ProofFormatError, match="1 proofs for 64 tokens"):
        verify_proofs(x, proofs[:1])
    with pytest.raises(ProofFormatError, match="chunk 1: proof has 64 points"):
        verify_proofs(x, [proofs[0], build_proofs(x, topk=64)[1]])
    with pytest.raises(ProofFormatError, match="chunk 1: proof has m = 0"):
        verify_proofs(x, [proofs[0], _proof(0, [0] * 128)])


def test_bytes_to_proofs_checks_total_length() -> None:
    column = proofs_to_bytes(build_proofs(_hidden_states(tokens=33, hidden=8)))
    assert len(column) == 258 + 2 + 2 * 8
    assert [len(p) for p in bytes_to_proofs(column, n_tokens=33, hidden_size=8)] == [258, 18]
    with pytest.raises(ProofFormatError, match="need 276"):
        bytes_to_proofs(column[:-2], n_tokens=33, hidden_size=8)
    with pytest.raises(ProofFormatError, match="need 516"):
        bytes_to_proofs(column, n_tokens=64, hidden_size=8)


def test_activations_must_be_bf16_matrix() -> None:
    with pytest.raises(TypeError, match="bf16"):
        build_proofs(torch.zeros(4, 64))
    with pytest.raises(ValueError, match=r"\[tokens, hidden\]"):
        build_proofs(torch.zeros(64, dtype=torch.bfloat16))


def test_encode_proof_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="uint16"):
        encode_proof(70000, np.array([1]))
    with pytest.raises(ProofFormatError, match="m = 0"):
        encode_proof(0, np.array([1]))
    assert encode_proof(P, np.array([1, 2])) == _proof(P, [1, 2])


def test_encode_proofs_is_encode_proof_row_by_row() -> None:
    rng = np.random.default_rng(0)
    moduli, coeffs = np.array([P, 7, 100, 65000]), rng.integers(0, P, size=(4, 7))
    coeffs[0] = P - 1
    assert encode_proofs(moduli, coeffs) == [
        encode_proof(m, c) for m, c in zip(moduli, coeffs, strict=True)
    ]
    assert encode_proofs(np.zeros(0), np.zeros((0, 128))) == []
    with pytest.raises(ProofFormatError, match="cannot be distinct mod 3"):
        encode_proofs([P, 3], np.ones((2, 4), dtype=np.int64))
    with pytest.raises(ProofFormatError, match="coefficient 1 is 65497"):
        encode_proofs([P], [[0, P]])
    with pytest.raises(ValueError, match="uint16"):
        encode_proofs([P], [[-1, 2]])
    with pytest.raises(ValueError, match=r"coeffs \[n, k\]"):
        encode_proofs([P, P], [[1, 2]])
