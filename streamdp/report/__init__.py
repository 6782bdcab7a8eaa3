"""``streamdp report``: a self-contained static HTML page of released topic snapshots.

Rendering (:mod:`streamdp.report.render`) is pure: snapshots and a vocabulary in, HTML out
(Plotly charts with plotly.js inlined, a jinja2 template; nothing is loaded from the network).
Reading snapshots (a folder, a file, the release service over HTTP, the snapshots topic) goes
through :mod:`streamdp.report.load`, a thin layer over :mod:`streamdp.snapshots`. docs/report.md.
"""
from __future__ import annotations

from streamdp.report.load import ReportInputError, load_snapshots, load_vocabulary, open_source

__all__ = ["ReportInputError", "render_report", "write_report", "report_from_dir"]


# render (jinja2, plotly) is imported when a report is written: `streamdp --help` and the
# snapshot readers do not load it


def render_report(*args, **kw) -> str:
    from streamdp.report.render import render_report as _render
    return _render(*args, **kw)


def write_report(*args, **kw):
    from streamdp.report.render import write_report as _write
    return _write(*args, **kw)


def report_from_dir(source, out, *, vocabulary=None, **kw):
    """Write the report of a snapshot folder, one snapshot file, an http(s):// release service
    or kafka://BOOTSTRAP/TOPIC to ``out``; returns the path written. ``vocabulary``: a
    Vocabulary, a file, or None (the source's own: a folder's vocabulary.txt, GET /vocabulary.txt)."""
    src = open_source(source)
    snaps = load_snapshots(src)
    if vocabulary is None or isinstance(vocabulary, str) or hasattr(vocabulary, "__fspath__"):
        vocabulary = load_vocabulary(vocabulary, src)
    return write_report(snaps, vocabulary, out, source=str(source), **kw)
