"""The aggregator kinds of a continual release: the BLT factorization (default) and the binary
tree, each answering the same questions for :class:`~streamdp.continual.ContinualRelease`
(which drives them without knowing which kind it runs; ``cr`` below is that release: not
named in annotations, continual imports this module)."""
from __future__ import annotations

import math

from streamdp.continual_mechanism import SketchNodeMechanism
from streamdp.epoch_sums import EpochSums
from streamdp.privacy.blt import (DEFAULT_MAX_EPOCHS, BLTAggregator, BLTParams, calibrate_unit_rho,
                                  default_params)
from streamdp.privacy.events import STREAM, epoch_partition
from streamdp.privacy.spend import Codec
from streamdp.privacy.tree import (TreeAggregator, completing_levels, covering_levels,
                                  tree_depth)


# an epoch's noised tree nodes, as a spend session's output store keeps them
NODES_CODEC = Codec(lambda nodes: [n.to_dict() for n in nodes],
                    lambda data: [EpochSums.from_dict(d) for d in data])
# (a BLT epoch's draw is y_t, a flat public array: the default array codec)


class BLTKind:
    """The BLT factorization (:mod:`streamdp.privacy.blt`) as a continual release drives it.

    Each aggregator kind answers the same questions (the continual release asks them without
    knowing which kind it runs): its state kind, its unit ρ and aggregator, the last epoch it
    may close, its noise multiplier, the largest raw sum a close would noise, its report
    fields and how it is restored."""

    state_kind = BLTAggregator.kind

    def depth(self, horizon: int) -> None:
        return None

    def default_params(self, horizon: int) -> BLTParams:
        return default_params(horizon)

    def unit_rho(self, cr, share: float | None) -> float:
        # ρ_unit ≤ ρ/W, W ≥ Σ_{j<T_max}(c_j + ε)² (ε: the BLT's rounding term; the
        # sensitivities Δ_b, hence ε, do not depend on ρ_node), shrunk until T_max epochs are
        # charged ≤ ρ with the samplers' rounding term (calibrate_unit_rho)
        def aggregator_for(rho_unit: float) -> BLTAggregator:
            return BLTAggregator(cr.blt_params, SketchNodeMechanism(
                cr.subspace, cr.clip, cr.split, rho_unit, cr.sampler, share,
                max_documents=cr.max_documents))
        return calibrate_unit_rho(cr.release_rho, aggregator_for)

    def make(self, cr, spender) -> BLTAggregator:
        return BLTAggregator(cr.blt_params, cr.mechanism, spender, label=cr.label)

    def epoch_limit(self, cr) -> float:
        return cr.tree.max_epochs if cr.tree else math.inf

    def noise_multiplier(self, cr) -> float:
        return cr.tree.noise_multiplier()

    def largest_raw_sum(self, cr, sums: EpochSums) -> int:
        return int(sums.sketch.n_docs)          # the epoch's own sum is what is noised

    def premise_checks(self, cr) -> int:
        """Every check is charged to every atom (T_max of them): a BLT step noises the raw
        buffers of all earlier epochs, so an epoch over N_max that passes its check (the δ
        event) breaks the rounding bound F_b of every later step, for every atom's document."""
        return DEFAULT_MAX_EPOCHS

    def premise_partition(self, cr, t: int) -> str:
        return STREAM

    def empty_completing(self, cr, t: int) -> None:
        """Noise only: nothing but the epoch's own sum is noised (it is replaced by zeros)."""

    def report_fields(self, cr, t: int) -> dict:
        return {
            "blt": {**cr.blt_params.to_dict(), "nbuf": cr.blt_params.nbuf,
                    "column_norm_squared": cr.blt_params.sensitivity_squared(),
                    "rounding_ratio": cr.tree.rounding_ratio(),
                    "charge_weight": cr.tree.charge_weight(),
                    "max_epochs": cr.tree.max_epochs,
                    "noise_multiplier": cr.noise_multiplier()},
            # the unit plan (sensitivity Δ_b, Σρ = rho_node = ρ/charge_weight), named as the
            # tree's node plan; epoch t reserved it at sensitivity Δ_b·(c_{t−1} + ε)
            "node_events": [e.to_dict() for e in cr.tree.unit_events()],
            # the premise checks' ρ included (a document's worst atom: epoch 1, one check; a
            # user: one check per epoch)
            "rho_spent_per_document": (cr.tree.rho_per_document(t)
                                       + cr.premise.rho * min(t, cr.premise.checks_per_atom)),
            "rho_per_document": (cr.tree.rho_per_document()
                                 + cr.premise.rho * cr.premise.checks_per_atom)}

    def restore(self, cr, state: dict) -> BLTAggregator:
        # the running mechanism's (θ, ω) fix σ and every future reservation: keep them, even if
        # this version would optimise slightly different ones for the horizon
        stored = BLTParams.from_dict(state["params"])
        if stored != cr.blt_params:
            cr.blt_params = stored
            cr._build(cr.tree.spender)
        return BLTAggregator.from_state(state, EpochSums.from_dict, cr.mechanism, cr.tree.spender)


class TreeKind:
    """The binary tree mechanism (:mod:`streamdp.privacy.tree`) as a continual release drives
    it (the questions: :class:`BLTKind`)."""

    state_kind = "tree_aggregator"

    def depth(self, horizon: int) -> int:
        return tree_depth(horizon)

    def default_params(self, horizon: int) -> None:
        return None

    def unit_rho(self, cr, share: float | None) -> float:
        return cr.release_rho / cr.depth         # each document is in one node per level

    def make(self, cr, spender) -> TreeAggregator:
        return TreeAggregator(cr.horizon, cr.mechanism, spender, label=cr.label, codec=NODES_CODEC)

    def epoch_limit(self, cr) -> float:
        return cr.horizon

    def noise_multiplier(self, cr) -> float:
        return math.sqrt(len(covering_levels(cr.tree.epoch)))

    def largest_raw_sum(self, cr, sums: EpochSums) -> int:
        """The largest tree node completing now: its raw partial plus this epoch."""
        n = int(sums.sketch.n_docs)
        t = cr.tree.epoch + 1
        largest = n
        for level in completing_levels(t, cr.horizon):
            part = cr.tree.raw_partial(level) if level >= 1 else None
            if part is not None:
                largest = max(largest, n + int(part.sketch.n_docs))
        return largest

    def premise_checks(self, cr) -> int:
        """A document is in one node per level; a check counts the largest completing node."""
        return cr.depth

    def premise_partition(self, cr, t: int) -> str:
        top = max(completing_levels(t, cr.horizon))     # the completing nodes are nested
        return epoch_partition(t - (1 << top) + 1, t)

    def empty_completing(self, cr, t: int) -> None:
        """Noise only: the nodes completing at t are drawn from zero sums (their raw partials
        would hold more documents than the check allows)."""
        for level in completing_levels(t, cr.horizon):
            if level >= 1 and cr.tree.raw_partial(level) is not None:
                cr.tree.empty_raw_partial(level, cr._as_epoch_sums(None))

    def report_fields(self, cr, t: int) -> dict:
        return {"tree_depth": cr.depth,
                "nodes_summed": [list(r) for r in cr.tree.covering_nodes(t)],
                "rho_per_document": (cr.depth * cr.rho_node
                                     + cr.premise.rho * cr.premise.checks_per_atom),
                "node_events": [e.to_dict() for e in cr.tree.node_events(1, 1)]}

    def restore(self, cr, state: dict) -> TreeAggregator:
        return TreeAggregator.from_state(state, EpochSums.from_dict, cr.mechanism,
                                         cr.tree.spender, codec=NODES_CODEC)


KINDS = {"blt": BLTKind(), "tree": TreeKind()}
AGGREGATORS = tuple(KINDS)
