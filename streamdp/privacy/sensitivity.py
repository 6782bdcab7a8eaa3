"""Per-block L2 sensitivities of the noised sums: the one place they are formed (DESIGN §4).

Each block's Δ is its clip bound plus twice the proven float64 rounding bound
(:mod:`streamdp.privacy.rounding`; proof sketched in docs/privacy.md, "Floating point").
Warm-up, release, refinement, the clustering start, the continual release and the privacy
report all read them here, so this module sits below all of them.
"""
from __future__ import annotations

from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.rounding import DEFAULT_MAX_DOCUMENTS_PER_SUM, check_max_documents
from streamdp.privacy.rounding import sensitivity as _rounded_sensitivity

#: clip bound behind each noised block (refinement's topic_word sums have norm ≤ 1 per document)
BLOCK_CLIP = {"count": lambda c: 1.0, "m1": lambda c: c.m1, "s1": lambda c: c.m1,
               "z": lambda c: c.z, "s2": lambda c: c.z, "s3": lambda c: c.s3,
               "warmup": lambda c: c.warmup, "topic_word": lambda c: 1.0,
               # the clustering start (streamdp.cluster_start): a vector of norm ≤ 1 per cluster
               # row (clip₁(Qᵀc/‖c‖₂), or its centred, whitened unit vector), one count per
               # document, and the centre draw's y yᵀ (Frobenius norm ‖y‖² ≤ 1)
               "cluster_sums": lambda c: 1.0, "cluster_counts": lambda c: 1.0,
               "cluster_moment": lambda c: 1.0}


def block_sensitivities(clip: ClipBounds, *,
                        max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM) -> dict[str, float]:
    """L2 sensitivity of each *computed* block sum under add/remove of one document.

    Δ_b = C_b·(1 + 10⁻⁹) + 2·R_b: the clip bound of the document's own contribution plus
    twice the proven bound R_b on the float64 rounding error of a sum of at most
    ``max_documents`` documents (the public premise N_max, enforced before noising;
    :mod:`streamdp.privacy.rounding`, docs/privacy.md "Floating point"). Blocks: count,
    m1, s1, z, s2, s3 (a release), warmup (the range finder), topic_word (refinement).
    """
    n_max = check_max_documents(max_documents)
    return {b: _rounded_sensitivity(b, f(clip), n_max) for b, f in BLOCK_CLIP.items()}
