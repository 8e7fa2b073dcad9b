"""Arithmetic in GF(65497) for TOPLOC: interpolation, evaluation and the index modulus.

Everything here is batched numpy int arithmetic with a constant number of array
operations per call, whatever the number of points k:

- Multiplication and inversion go through discrete-log tables (a primitive root g,
  ``EXP[i] = g**i``, ``LOG[EXP[i]] = i``), so a product of k factors is one sum of
  logs and an inverse is one negated log.
- Interpolation is Lagrange's formula evaluated at k *fixed* points z (where the
  polynomial is then known), followed by one multiplication with the inverse
  Vandermonde matrix of z, computed once per k and cached. Any correct
  interpolation gives the same unique polynomial of degree < k, so the coefficients
  agree with the reference's Newton interpolation.
- Dot products run as float64 BLAS matrix products. They are exact: every term is a
  product of two integers below P < 2**16, so a sum of k <= 2**20 terms
  (``MAX_POINTS``) stays below 2**52.
- No `%` on the k x k arrays (it costs more than everything else): tables are laid
  out so that shifted sums index them directly.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

P = 65497
"""The prime modulus of the TOPLOC field (the reference's choice)."""

_ORDER = P - 1  # order of the multiplicative group; logs live modulo this

MAX_POINTS = 1 << 20
"""Most points one polynomial may have for the float64 products to stay exact."""


def _primitive_root() -> int:
    """Return the smallest generator of GF(P)*, found by the standard prime-factor test."""
    factors, n, d = [], _ORDER, 2
    while d * d <= n:
        if n % d == 0:
            factors.append(d)
            while n % d == 0:
                n //= d
        d += 1
    if n > 1:
        factors.append(n)
    return next(g for g in range(2, P) if all(pow(g, _ORDER // q, P) != 1 for q in factors))


def _log_tables() -> tuple[np.ndarray, np.ndarray]:
    """Build EXP (g**i for i in [0, P-1), int64) and LOG (its inverse, LOG[0] = 0)."""
    g = _primitive_root()
    # g**(256a + b) = (g**256)**a * g**b: two short sequential tables and one outer product.
    low = np.ones(256, dtype=np.int64)
    high = np.ones((_ORDER + 255) // 256, dtype=np.int64)
    for i in range(1, low.size):
        low[i] = low[i - 1] * g % P
    step = pow(g, 256, P)
    for i in range(1, high.size):
        high[i] = high[i - 1] * step % P
    exp = (high[:, None] * low[None, :] % P).reshape(-1)[:_ORDER]
    log = np.zeros(P, dtype=np.int64)
    log[exp] = np.arange(_ORDER, dtype=np.int64)
    return exp, log


EXP, LOG = _log_tables()

# Hot-path copies of the tables, laid out so that no `%` (slow, per element) is needed
# on the k x k arrays:
# - _LOG_OF_DIFF[a - b + P] = log((a - b) mod P) for a, b in [0, P). Entry P (a == b)
#   is 0 = log(1): a zero factor drops out of a sum of logs, and callers that can meet
#   one mask it explicitly.
# - _EXP_WIDE[i] = g**i as float64 for i in [0, 3(P-1)): the index may be a sum of
#   three reduced logs. float64 because the products that follow run as BLAS matrix
#   products, exact here: each term is below P**2 < 2**32 and k terms stay below 2**53.
_LOG_OF_DIFF = np.concatenate([LOG, LOG]).astype(np.int32)
_EXP_WIDE = np.tile(EXP, 3).astype(np.float64)


def inverse(a: np.ndarray) -> np.ndarray:
    """Multiplicative inverse mod P of every (nonzero) element of ``a``."""
    return EXP[(-LOG[a]) % _ORDER]


def _fixed_points(k: int) -> np.ndarray:
    """The k points where ``interpolate`` evaluates the polynomial: P-1, P-2, ..., P-k.

    They sit at the top of the field, where x = index mod m lands only for chunks of
    more than about 65,000 values; a coincidence is still handled exactly.
    """
    return P - 1 - np.arange(k, dtype=np.int64)


@lru_cache(maxsize=16)
def _inverse_vandermonde(k: int) -> np.ndarray:
    """Matrix W (k x k, float64 of exact integers) with coeffs = values @ W.

    Row t holds the coefficients of the Lagrange basis polynomial of z_t:
    L_t(x) = w_t * prod_{j != t} (x - z_j), built by synthetic division of
    M(x) = prod_j (x - z_j) by (x - z_t). Runs once per k, off the hot path.
    """
    z = _fixed_points(k)
    master = np.zeros(k + 1, dtype=np.int64)  # coefficients of M, lowest degree first
    master[0] = 1
    for zj in z:
        master = (np.concatenate(([0], master[:-1])) - zj * master) % P
    quotient = np.zeros((k, k), dtype=np.int64)  # quotient[t, i] = [x^i] M(x) / (x - z_t)
    quotient[:, k - 1] = master[k]
    for i in range(k - 1, 0, -1):
        quotient[:, i - 1] = (master[i] + z * quotient[:, i]) % P
    diff = (z[:, None] - z[None, :]) % P
    np.fill_diagonal(diff, 1)
    weight = inverse(EXP[LOG[diff].sum(axis=1) % _ORDER])
    return (quotient * weight[:, None] % P).astype(np.float64)


def _mod_p(a: np.ndarray) -> np.ndarray:
    """Reduce an exact-integer float64 array mod P into int64."""
    return a.astype(np.int64) % P


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients (lowest degree first) of the polynomials through (x, y), batched.

    ``x``, ``y``: int arrays ``[batch, k]`` with entries in [0, P) and, per row,
    pairwise distinct x. Returns int64 ``[batch, k]``: row b holds the unique
    polynomial f of degree < k with f(x[b, j]) = y[b, j] over GF(P).
    """
    x = np.asarray(x, dtype=np.int32)
    y = np.asarray(y, dtype=np.float64)
    _, k = x.shape
    if k > MAX_POINTS:
        raise ValueError(f"{k} points is more than the {MAX_POINTS} this field code supports")
    z = _fixed_points(k).astype(np.int32)

    # Barycentric weights w_j = 1 / prod_{i != j} (x_j - x_i), as logs reduced into
    # [0, P-1). The diagonal (x_j - x_j = 0) contributes log 1 = 0.
    log_w = np.take(_LOG_OF_DIFF, (x + P)[:, :, None] - x[:, None, :]).sum(axis=2)
    log_w = ((-log_w) % _ORDER).astype(np.int32)

    # f(z_t) = M(z_t) * sum_j y_j w_j / (z_t - x_j), with M(z) = prod_j (z - x_j).
    shifted_dist = (z + P)[None, :, None] - x[:, None, :]  # (z_t - x_j) + P, [batch, t, j]
    log_dist = np.take(_LOG_OF_DIFF, shifted_dist)
    log_m = (log_dist.sum(axis=2) % _ORDER).astype(np.int32)  # zeros skipped; fixed below
    lagrange = np.take(
        _EXP_WIDE, (log_m + _ORDER)[:, :, None] - log_dist + log_w[:, None, :]
    )
    values = _mod_p(np.matmul(lagrange, y[:, :, None])[:, :, 0])

    # Where z_t coincides with some x_j, M(z_t) = 0 and the formula is meaningless:
    # the polynomial's value there is simply y_j.
    hit = shifted_dist == P
    row_hit = hit.any(axis=2)
    if row_hit.any():
        at_hit = (hit * y[:, None, :]).sum(axis=2).astype(np.int64)
        values = np.where(row_hit, at_hit, values)

    return _mod_p(values.astype(np.float64) @ _inverse_vandermonde(k))


# Exponents s = _SPLIT * hi + lo: evaluation gets log(x**s) from two small tables.
_SPLIT = 16


def evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Evaluate polynomials at points, batched: ``coeffs [batch, k]``, ``x [batch, n]``.

    Returns int64 ``[batch, n]`` with entry (b, j) = f_b(x[b, j]) mod P. Uses the power
    matrix x_j**s (via logs) and one matrix product instead of a k-step Horner loop.
    """
    coeffs = np.asarray(coeffs, dtype=np.float64)
    x = np.asarray(x, dtype=np.int64) % P
    batch, n = x.shape
    k = coeffs.shape[1]
    n_hi = -(-k // _SPLIT)
    log_x = LOG[x][:, :, None]
    lo = log_x * np.arange(_SPLIT) % _ORDER  # [batch, n, lo]
    hi = log_x * (_SPLIT * np.arange(n_hi)) % _ORDER  # [batch, n, hi]
    exponent = (hi[:, :, :, None] + lo[:, :, None, :]).reshape(batch, n, -1)[:, :, :k]
    powers = np.take(_EXP_WIDE, exponent)
    # 0**s is 1 for s = 0 and 0 otherwise; the log table cannot express it.
    zero = x == 0
    if zero.any():
        powers[zero] = (np.arange(k) == 0).astype(np.float64)
    return _mod_p(np.matmul(powers, coeffs[:, :, None])[:, :, 0])


def injective_modulus(indices: np.ndarray, n_values: int) -> np.ndarray:
    """Per row of ``indices [batch, k]``, the largest m <= P with the indices distinct mod m.

    ``n_values`` is the number of values the indices were drawn from; if it is at most
    P every index is already below P and m = P without further work. Otherwise
    candidates are tried from P downwards in blocks, all at once within a block.
    Raises ValueError if no m >= k exists (only a deliberately crafted chunk could).
    """
    indices = np.asarray(indices, dtype=np.int64)
    batch, k = indices.shape
    result = np.full(batch, P, dtype=np.int64)
    if n_values <= P:
        return result
    collide = _has_collision(indices % P)
    for row in np.flatnonzero(collide):
        result[row] = _search_modulus(indices[row])
    return result


def _has_collision(residues: np.ndarray) -> np.ndarray:
    """For each row of residues (last axis), whether any two are equal."""
    ordered = np.sort(residues, axis=-1)
    return (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)


def _search_modulus(indices: np.ndarray) -> int:
    """Largest m < P with ``indices`` distinct mod m (P itself already failed)."""
    k = indices.size
    top, block = P - 1, 64
    while top >= k:
        candidates = np.arange(top, max(k, top - block + 1) - 1, -1, dtype=np.int64)
        ok = ~_has_collision(indices[None, :] % candidates[:, None])
        if ok.any():
            return int(candidates[np.argmax(ok)])
        top = int(candidates[-1]) - 1
        block = min(block * 2, 4096)  # adversarial inputs: bounded total work
    raise ValueError(f"no modulus m in [{k}, {P}] makes these {k} indices distinct")
