"""Privacy accounting and noise: events, zCDP conversions, ledger, accountant,
tree and BLT mechanisms, samplers. See docs/privacy_accounting.md."""
from streamdp.privacy.accountant import Accountant, BudgetExhausted, LedgerMismatch, Reservation
from streamdp.privacy.atom_loads import AtomLoads, atom_loads, events_loads
from streamdp.privacy.blt import BLTAggregator
from streamdp.privacy.blt_factorization import BLTParams, default_params, optimize_blt
from streamdp.privacy.conversions import RHO_RTOL, zcdp_delta, zcdp_epsilon, zcdp_rho
from streamdp.privacy.events import (STREAM, WARMUP, BudgetSpender, EventLog, GaussianEvent,
                                     Partition, epoch_partition, parse_partition,
                                     rho_by_partition, sigma_for_rho)
from streamdp.privacy.ledger import FileLedger, Ledger, LedgerCorrupt, LedgerRecord
from streamdp.privacy.noise import CSPRNGGaussianSampler, GaussianSampler, OpenDPGaussianSampler
from streamdp.privacy.tree import (GaussianNodeMechanism, HorizonExceeded, NodeMechanism,
                                   TreeAggregator, tree_depth)

__all__ = [
    "Accountant", "AtomLoads", "BudgetExhausted", "LedgerMismatch", "Reservation",
    "atom_loads", "events_loads",
    "BLTAggregator", "BLTParams", "default_params", "optimize_blt",
    "RHO_RTOL", "zcdp_delta", "zcdp_epsilon", "zcdp_rho",
    "STREAM", "WARMUP", "BudgetSpender", "EventLog", "GaussianEvent", "Partition",
    "epoch_partition", "parse_partition", "rho_by_partition", "sigma_for_rho",
    "FileLedger", "Ledger", "LedgerCorrupt", "LedgerRecord",
    "CSPRNGGaussianSampler", "GaussianSampler", "OpenDPGaussianSampler",
    "GaussianNodeMechanism", "HorizonExceeded", "NodeMechanism", "TreeAggregator", "tree_depth",
]
