"""Baseline topic models for the comparison of issue 5 (``benchmarks/compare.py``).

Every module exposes functions with the same shape, so ``compare.py`` can score any of them with
the shared metrics of ``streamdp.evaluation``:

* non-private (``nonprivate.py``): ``fit_sklearn`` / ``fit_gensim``
  ``(counts_csr, n_topics, *, seed, **kw) -> (topic_word (k, d), info)``;
* private (``seed000.py``, ``dpsvi.py``, ``topicdp.py``): ``fit(counts_csr, n_topics, *,
  epsilon, delta, seed, **kw) -> (topic_word (k, d), info)``.

``topic_word`` rows are on the simplex; ``info`` is a dict with at least the fit time. All models
of one comparison get the same public vocabulary (the columns of ``counts_csr``) and the same k.
These are benchmark code, not part of the installed ``streamdp`` package.
"""
