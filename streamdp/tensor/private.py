"""Seed 003 Algorithm 3 in whitened space: noise on every power-method query.

The released quantities are queries on the *raw* whitened third-moment sum
S = S3sum(W, W, W) (k×k×k, never released itself):

    g1(u) = S(I, u, u) = S3sum(W, Wu, Wu)   sensitivity  C3 · ‖W‖₂ · ‖Wu‖²
    g2(u) = S(u, u, u) = S3sum(Wu, Wu, Wu)  sensitivity  C3 · ‖Wu‖³

because adding one document changes S3sum by a tensor Δ with ‖Δ‖_F ≤ C3 (its
clipped s3 contribution) and ‖Δ(A, b, c)‖ ≤ ‖Δ‖_F ‖A‖₂ ‖b‖ ‖c‖. W and u are
public when a query is asked (W comes from already-noised blocks, u from
earlier noised answers), so a sensitivity that depends on them is fine: every
query uses the same noise multiplier ν, so each is 1/(2ν²)-zCDP whatever u is,
and K adaptively chosen queries compose to K/(2ν²) (zCDP adaptive composition).
The rest of T(I,u,u) — the division by the released count, the public
correction terms from noised s1/s2, and deflation by earlier released
components — is post-processing.
"""
from __future__ import annotations

import numpy as np

from streamdp.privacy.noise import GaussianSampler
from streamdp.tensor.power_method import contract_iuu, contract_uuu


class QueryBudgetExceeded(RuntimeError):
    """More queries were asked than were planned (and paid for)."""


class NoisyQueryOracle:
    """Answers T(I,u,u), T(u,u,u) with T = S/N + T_pub − deflation, S noised per query.

    Parameters
    ----------
    S_raw : (k,k,k)   raw whitened sum S3sum(W,W,W) — sensitive
    T_public : (k,k,k) post-processing part (from already-released blocks)
    count : float     released (noised) document count N
    clip_s3 : float   C3
    W_norm : float    ‖W‖₂
    W : (k', k)       whitening matrix, to compute ‖Wu‖
    noise_multiplier : float  ν = σ_query / sensitivity_query
    max_queries : int  K, as planned and reserved
    """

    refine = False   # refinement would cost queries that were not planned

    def __init__(self, S_raw, T_public, count, clip_s3, W, noise_multiplier, max_queries,
                 sampler: GaussianSampler) -> None:
        self.S = np.asarray(S_raw, dtype=np.float64)
        self.T_pub = np.asarray(T_public, dtype=np.float64).copy()
        self.N = float(count)
        self.C3 = float(clip_s3)
        self.W = W
        self.W_norm = float(np.linalg.norm(W, 2))
        self.nu = float(noise_multiplier)
        self.max_queries = int(max_queries)
        self.sampler = sampler
        self.n_queries = 0
        self._components: list[tuple[float, np.ndarray]] = []

    @property
    def dim(self) -> int:
        return self.S.shape[0]

    def _charge(self, n: int) -> None:
        if self.n_queries + n > self.max_queries:
            raise QueryBudgetExceeded(
                f"{self.n_queries + n} power-method queries asked, {self.max_queries} planned")
        self.n_queries += n

    def _deflation(self, U: np.ndarray, power: int) -> np.ndarray:
        out = 0.0
        for lam, v in self._components:
            proj = v @ U
            out = out + (lam * v[:, None] * proj**2 if power == 2 else lam * proj**3)
        return out

    def iuu(self, U: np.ndarray) -> np.ndarray:
        self._charge(U.shape[1])
        wu = np.linalg.norm(self.W @ U, axis=0)                   # ‖W u‖ per query
        sens = self.C3 * self.W_norm * wu**2
        raw = contract_iuu(self.S, U)
        noised = np.column_stack([self.sampler.add_noise(raw[:, j], self.nu * s)
                                  for j, s in enumerate(sens)])
        return noised / self.N + contract_iuu(self.T_pub, U) - self._deflation(U, 2)

    def uuu(self, U: np.ndarray) -> np.ndarray:
        self._charge(U.shape[1])
        wu = np.linalg.norm(self.W @ U, axis=0)
        sens = self.C3 * wu**3
        raw = contract_uuu(self.S, U)
        noised = np.array([self.sampler.add_noise(raw[j:j + 1], self.nu * s)[0]
                           for j, s in enumerate(sens)])
        return noised / self.N + contract_uuu(self.T_pub, U) - self._deflation(U, 3)

    def deflate(self, lam: float, v: np.ndarray) -> None:
        self._components.append((float(lam), np.asarray(v, dtype=np.float64).copy()))
