"""Robust tensor power method (Anandkumar et al. 2014, Alg. 1) over query oracles.

The algorithm only touches the tensor through two queries, T(I, u, u) and
T(u, u, u), plus deflation by already-found components. Putting those behind an
oracle lets one loop serve both release mechanisms (DESIGN §4):

* :class:`ExactOracle` — a (noised-once, or non-private) k×k×k tensor; the power
  method is post-processing, so it may use as many restarts and iterations as
  it likes, and refines the winning restart with further iterations.
* :class:`streamdp.tensor.private.NoisyQueryOracle` — seed 003 Algorithm 3:
  every query is answered with fresh Gaussian noise, for a fixed, pre-planned
  number of queries K = k·L·(R+1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits


@dataclass(frozen=True)
class PowerMethodConfig:
    """Restarts L, iterations R per restart, and the public seed of the starts."""

    n_restarts: int = 15
    n_iter: int = 30
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_restarts < 1 or self.n_iter < 1:
            raise ValueError(f"power method needs n_restarts >= 1 and n_iter >= 1, got "
                             f"{self.n_restarts}, {self.n_iter}")

    def n_queries(self, n_components: int) -> int:
        """K = k·L·(R+1): R power steps and one evaluation per restart."""
        return n_components * self.n_restarts * (self.n_iter + 1)


def contract_iuu(T: np.ndarray, U: np.ndarray) -> np.ndarray:
    """T(I, u, u) for every column u of U: (k,k,k), (k,L) → (k,L).

    One GEMM (k²×k)·(k×L), then the second contraction without BLAS: ≈ 2× faster than a
    generic einsum path (the power method makes k·L·(R+1)·2 of these calls)."""
    k, L = T.shape[0], U.shape[1]
    TU = (T.reshape(k * k, k) @ U).reshape(k, k, L)
    return np.einsum("ijl,jl->il", TU, U)


def contract_uuu(T: np.ndarray, U: np.ndarray) -> np.ndarray:
    """T(u, u, u) for every column u of U: → (L,)."""
    return np.einsum("il,il->l", contract_iuu(T, U), U)


class ExactOracle:
    """Queries answered exactly on a fixed tensor, with explicit deflation."""

    refine = True

    def __init__(self, T: np.ndarray) -> None:
        T = np.asarray(T, dtype=np.float64)
        if T.ndim != 3 or len(set(T.shape)) != 1:
            raise ValueError(f"expected a cubical 3-tensor, got shape {T.shape}")
        self.T = T.copy()

    @property
    def dim(self) -> int:
        return self.T.shape[0]

    def iuu(self, U: np.ndarray) -> np.ndarray:
        return contract_iuu(self.T, U)

    def uuu(self, U: np.ndarray) -> np.ndarray:
        return contract_uuu(self.T, U)

    def deflate(self, lam: float, v: np.ndarray) -> None:
        self.T -= lam * np.einsum("i,j,k->ijk", v, v, v)


def _normalize_columns(U: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(U, axis=0)
    n[n == 0] = 1.0
    return U / n


def robust_power_method(oracle, n_components: int, config: PowerMethodConfig = PowerMethodConfig()):
    """Find ``n_components`` (λ_i, v_i) with T ≈ Σ λ_i v_i^{⊗3}.

    Returns
    -------
    lambdas : (k,) array, positive
    V : (m, k) array, unit columns
    """
    m = oracle.dim
    if not 1 <= n_components <= m:
        raise ValueError(f"cannot extract {n_components} components from a {m}-dimensional tensor")
    # thousands of small products (k²·k·L flops each): BLAS threads only add synchronisation,
    # and on a busy machine spinning threads made them 10-25× slower (measured, issue 13)
    with threadpool_limits(limits=1, user_api="blas"):
        return _power_method(oracle, n_components, config, m)


def _power_method(oracle, n_components: int, config: PowerMethodConfig, m: int):
    rng = np.random.default_rng(config.seed)
    lambdas = np.zeros(n_components)
    V = np.zeros((m, n_components))
    for i in range(n_components):
        U = _normalize_columns(rng.standard_normal((m, config.n_restarts)))
        for _ in range(config.n_iter):
            U = _normalize_columns(oracle.iuu(U))
        vals = oracle.uuu(U)
        # odd order: T(−u,−u,−u) = −T(u,u,u); flip so every candidate has λ ≥ 0
        U = U * np.where(vals < 0, -1.0, 1.0)
        vals = np.abs(vals)
        best = int(np.argmax(vals))
        u, lam = U[:, best], float(vals[best])
        if getattr(oracle, "refine", False):
            for _ in range(config.n_iter):
                u = _normalize_columns(oracle.iuu(u[:, None]))[:, 0]
            lam = float(oracle.uuu(u[:, None])[0])
            if lam < 0:
                u, lam = -u, -lam
        lambdas[i], V[:, i] = lam, u
        oracle.deflate(lam, u)
    return lambdas, V
