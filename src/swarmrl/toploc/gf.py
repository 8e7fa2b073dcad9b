"""Arithmetic in GF(65497) for TOPLOC: interpolation, evaluation and the index modulus.

Everything here is batched numpy arithmetic with a constant number of array operations
per block of chunks, whatever the number of points k:

- Multiplication and inversion go through discrete-log tables (a primitive root g,
  ``EXP[i] = g**i``, ``LOG[EXP[i]] = i``), so a product of k factors is one sum of
  logs and an inverse is one negated log.
- Points below ``SMALL_DOMAIN`` (every chunk of a model with hidden size <= 256) take
  the table path: per k, tables over the whole domain hold x**s and log(z_t - x), so a
  chunk's k x k matrices are row gathers, and interpolation is three batched
  matrix-vector products (barycentric weights from M'(x_j), then the coefficients of
  sum_j y_j w_j M(X) / (X - x_j) through the Hankel matrix of M). Evaluation is one
  gather and one product.
- Other points take the Lagrange path: Lagrange's formula evaluated at k *fixed* points
  z (where the polynomial is then known), followed by one multiplication with the
  inverse Vandermonde matrix of z, computed once per k and cached. Any correct
  interpolation gives the same unique polynomial of degree < k, so both paths agree
  with each other and with the reference's Newton interpolation.
- Dot products run as float64 BLAS matrix products. They are exact: every term is a
  product of two integers below P < 2**16, so a sum of k <= 2**20 terms
  (``MAX_POINTS``) stays below 2**52.
- No `%` on the k x k arrays (it costs more than everything else): tables are laid
  out so that shifted sums index them directly.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided
from torch.nn.functional import embedding_bag

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
# The table path's compact copies (128 KiB each, so they stay cached between calls):
# _EXP_U16[i] = g**i for i in [0, P-1] (entry P-1 is g**0 = 1 again), _LOG_U16 = LOG.
_EXP_U16 = np.append(EXP, 1).astype(np.uint16)
_LOG_U16 = LOG.astype(np.uint16)


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


SMALL_DOMAIN = 8192
"""Points below this (and k <= ``_TABLE_MAX_POINTS``) take the table path."""

# The table path sums k logs below P - 1 in float32, exact while k * (P - 2) < 2**24.
_TABLE_MAX_POINTS = 256
# Chunks per numpy call: the table path's [block, k, k] temporaries (128 KiB per chunk at
# k = 128) stay in cache at 16; the Lagrange path has four k x k temporaries per chunk.
_TABLE_BLOCK = 16
_LAGRANGE_BLOCK = 4


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients (lowest degree first) of the polynomials through (x, y), batched.

    ``x``, ``y``: int arrays ``[batch, k]`` with entries in [0, P) and, per row,
    pairwise distinct x. Returns int64 ``[batch, k]``: row b holds the unique
    polynomial f of degree < k with f(x[b, j]) = y[b, j] over GF(P). Any batch size;
    blocks of it go through numpy at a time.
    """
    x = np.asarray(x, dtype=np.int64)
    y = np.asarray(y, dtype=np.float64)
    batch, k = x.shape
    if k > MAX_POINTS:
        raise ValueError(f"{k} points is more than the {MAX_POINTS} this field code supports")
    if batch == 0:
        return np.zeros((0, k), dtype=np.int64)
    if _in_tables(x, k):
        powers, gaps = _power_table(k), _gap_table(k)
        return np.concatenate(
            [
                _interpolate_tables(x[i : i + _TABLE_BLOCK], y[i : i + _TABLE_BLOCK], powers, gaps)
                for i in range(0, batch, _TABLE_BLOCK)
            ]
        )
    return np.concatenate(
        [
            _interpolate_lagrange(x[i : i + _LAGRANGE_BLOCK], y[i : i + _LAGRANGE_BLOCK])
            for i in range(0, batch, _LAGRANGE_BLOCK)
        ]
    )


def _in_tables(x: np.ndarray, k: int) -> bool:
    """Whether the table path covers these points: k <= 256 and every x < SMALL_DOMAIN."""
    return k <= _TABLE_MAX_POINTS and (x.size == 0 or int(x.max()) < SMALL_DOMAIN)


# One table pair per k, over the whole domain (2 + 4 MiB at k = 128, built in ~20 ms):
# a chunk only touches the rows below its number of values, so a bigger domain costs
# memory, not cache.
@lru_cache(maxsize=4)
def _power_table(k: int) -> np.ndarray:
    """``T[x, s] = x**s mod P`` for x < SMALL_DOMAIN and s < k, as uint16 (0**0 = 1)."""
    x = np.arange(SMALL_DOMAIN, dtype=np.int64)
    table = EXP[LOG[x][:, None] * np.arange(k) % _ORDER]
    table[0] = np.arange(k) == 0
    return table.astype(np.uint16)


@lru_cache(maxsize=4)
def _gap_table(k: int) -> torch.Tensor:
    """``T[x, t] = log(z_t - x)`` for x < SMALL_DOMAIN and the k fixed points z, float32.

    z_t >= P - k > x, so every gap is nonzero; float32 holds the sum of k such logs
    exactly for k <= ``_TABLE_MAX_POINTS``.
    """
    z = _fixed_points(k)
    return torch.from_numpy(LOG[z[None, :] - np.arange(SMALL_DOMAIN)[:, None]].astype(np.float32))


@lru_cache(maxsize=16)
def _fixed_power(k: int) -> np.ndarray:
    """``z_t**k mod P`` for the k fixed points, as float64."""
    return EXP[LOG[_fixed_points(k)] * k % _ORDER].astype(np.float64)


def _interpolate_tables(
    x: np.ndarray, y: np.ndarray, powers: np.ndarray, gaps: torch.Tensor
) -> np.ndarray:
    """``interpolate`` for x inside the tables' domain: gathers and matrix-vector products.

    With M(X) = prod_j (X - x_j) = sum_s m_s X^s and w_j = 1 / M'(x_j),
    f(X) = sum_j y_j w_j M(X) / (X - x_j), whose coefficient i is
    c_i = sum_r m_{i+1+r} v_r with v_r = sum_j y_j w_j x_j^r.
    """
    batch, k = x.shape
    # m_0 .. m_{k-1} from M at the fixed points (M is monic: M(z) - z^k has degree < k).
    # log M(z_t) = sum_j gaps[x_j, t]: torch's embedding_bag sums the rows without
    # materializing the [batch, k, k] gather (float32 sums of such logs are exact).
    log_m = embedding_bag(torch.from_numpy(x), gaps, mode="sum").numpy()
    m_at_z = np.take(_EXP_U16, log_m.astype(np.intp) % _ORDER)
    low = _reduce((m_at_z - _fixed_power(k) + P) @ _inverse_vandermonde(k))

    # M'(X) = sum_s (s+1) m_{s+1} X^s, evaluated at every x_j: one power-row gather.
    # Its coefficients stay unreduced (< k * P < 2**24): the product's sum stays < 2**48.
    derivative = np.empty((batch, k, 1))
    derivative[:, :-1, 0] = low[:, 1:] * np.arange(1, k)
    derivative[:, -1, 0] = k
    gathered, power_rows, hankel = (buffer[:batch] for buffer in _scratch(k))
    np.take(powers, x, axis=0, out=gathered)
    np.copyto(power_rows, gathered)  # [batch, j, s] = x_j**s
    m_prime = np.matmul(power_rows, derivative)[:, :, 0].astype(np.intp) % P
    inverse_m_prime = np.take(_EXP_U16, _ORDER - np.take(_LOG_U16, m_prime).astype(np.intp))
    weighted = _reduce(y * inverse_m_prime)  # y_j w_j
    v = _reduce(np.matmul(weighted[:, None, :], power_rows)[:, 0, :])

    # Hankel matrix H[i, r] = m_{i+1+r} (m_k = 1, zero beyond), as sliding windows.
    shifted = np.zeros((batch, 2 * k - 1))
    shifted[:, : k - 1] = low[:, 1:]
    shifted[:, k - 1] = 1
    row, step = shifted.strides
    np.copyto(hankel, as_strided(shifted, (batch, k, k), (row, step, step)))
    return np.matmul(hankel, v[:, :, None])[:, :, 0].astype(np.int64) % P


_SCRATCH = threading.local()


def _scratch(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's ``[_TABLE_BLOCK, k, k]`` buffers (uint16, float64, float64), kept.

    Fresh multi-MiB temporaries per block cost more than the arithmetic: right after
    the sampler has run, the allocator returns them to the OS and every block then
    page-faults them back in (measured: interpolation 1.5-2x slower in the worker).
    """
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].shape[1] != k:
        shape = (_TABLE_BLOCK, k, k)
        buffers = (np.empty(shape, np.uint16), np.empty(shape), np.empty(shape))
        _SCRATCH.buffers = buffers
    return buffers


_INVERSE_P = 1.0 / P


def _reduce(a: np.ndarray) -> np.ndarray:
    """``a mod P`` for float64 ``a`` holding integers in [0, 2**42], staying in float64.

    floor((a + 1/2) / P) is the exact quotient: the float error (< 2**-25) is far below
    the 1/(2P) margin the half adds. ``np.fmod`` would be exact too but is 10x slower.
    """
    quotient = a + 0.5
    quotient *= _INVERSE_P
    np.floor(quotient, out=quotient)
    quotient *= P
    return np.subtract(a, quotient, out=quotient)


def _interpolate_lagrange(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``interpolate`` for any points: Lagrange at the fixed points, then inverse Vandermonde."""
    x = x.astype(np.int32)
    _, k = x.shape
    z = _fixed_points(k).astype(np.int32)

    # Barycentric weights w_j = 1 / prod_{i != j} (x_j - x_i), as logs reduced into
    # [0, P-1). The diagonal (x_j - x_j = 0) contributes log 1 = 0.
    log_w = np.take(_LOG_OF_DIFF, (x + P)[:, :, None] - x[:, None, :]).sum(axis=2)
    log_w = ((-log_w) % _ORDER).astype(np.int32)

    # f(z_t) = M(z_t) * sum_j y_j w_j / (z_t - x_j), with M(z) = prod_j (z - x_j).
    shifted_dist = (z + P)[None, :, None] - x[:, None, :]  # (z_t - x_j) + P, [batch, t, j]
    log_dist = np.take(_LOG_OF_DIFF, shifted_dist)
    log_m = (log_dist.sum(axis=2) % _ORDER).astype(np.int32)  # zeros skipped; fixed below
    lagrange = np.take(_EXP_WIDE, (log_m + _ORDER)[:, :, None] - log_dist + log_w[:, None, :])
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
    matrix x_j**s (gathered from a table for points below ``SMALL_DOMAIN``, else built
    from logs) and one matrix product instead of a k-step Horner loop.
    """
    coeffs = np.asarray(coeffs, dtype=np.float64)
    x = np.asarray(x, dtype=np.int64) % P
    batch, n = x.shape
    k = coeffs.shape[1]
    if batch == 0 or n == 0:
        return np.zeros((batch, n), dtype=np.int64)
    if _in_tables(x, k):
        powers = _power_table(k)
        blocks = [
            np.matmul(
                powers[x[i : i + _TABLE_BLOCK]].astype(np.float64),
                coeffs[i : i + _TABLE_BLOCK, :, None],
            )
            for i in range(0, batch, _TABLE_BLOCK)
        ]
    else:
        blocks = [
            np.matmul(
                _powers_from_logs(x[i : i + _LAGRANGE_BLOCK], k),
                coeffs[i : i + _LAGRANGE_BLOCK, :, None],
            )
            for i in range(0, batch, _LAGRANGE_BLOCK)
        ]
    return np.concatenate(blocks)[:, :, 0].astype(np.int64) % P


def _powers_from_logs(x: np.ndarray, k: int) -> np.ndarray:
    """``[batch, n, k]`` float64 with entry (b, j, s) = x[b, j]**s mod P, from logs."""
    batch, n = x.shape
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
    return powers


def injective_modulus(indices: np.ndarray, n_values: int) -> np.ndarray:
    """Per row of ``indices [batch, k]``, the largest m <= P with the indices distinct mod m.

    ``n_values`` is the number of values the indices were drawn from; if it is at most
    P every index is already below P and m = P without further work. Otherwise
    candidates are tried from P downwards in blocks, all at once within a block.
    Raises ValueError if no m >= k exists (only a deliberately crafted chunk could).
    """
    indices = np.asarray(indices, dtype=np.int64)
    batch, _k = indices.shape
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
