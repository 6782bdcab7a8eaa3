"""streamdp: differentially private streaming spectral topic models.

Public entry points: :class:`StreamingSpectralLDA`, :func:`fit`, the sketch
:class:`WhitenedSketch`, and :class:`TopicSnapshot`.
"""
from streamdp.cluster_start import ClusterStartConfig
from streamdp.continual import ContinualRelease
from streamdp.estimator import StreamingSpectralLDA
from streamdp.fitting import fit
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import SketchSums, WhitenedSketch
from streamdp.privacy.epochs import EpochClock
from streamdp.refinement import RefinementConfig
from streamdp.privacy.plan import BudgetSplit
from streamdp.snapshot import TopicSnapshot
from streamdp.public_start import PublicStart
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

__all__ = ["StreamingSpectralLDA", "fit", "ClipBounds", "SketchSums", "WhitenedSketch",
           "BudgetSplit", "TopicSnapshot", "Subspace", "WarmupSketch", "ContinualRelease",
           "EpochClock", "RefinementConfig", "ClusterStartConfig", "PublicStart"]
__version__ = "0.1.0"
