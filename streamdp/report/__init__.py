"""``streamdp report``: a self-contained static HTML page of released topic snapshots.

Rendering (:mod:`streamdp.report.render`) is pure: snapshots and a vocabulary in, HTML out
(Plotly charts with plotly.js inlined, a jinja2 template; nothing is loaded from the network).
Reading snapshots (a folder, a file, the snapshots topic) goes through
:mod:`streamdp.report.load`. docs/report.md.
"""
from __future__ import annotations

from streamdp.report.load import ReportInputError

__all__ = ["ReportInputError", "render_report", "write_report", "report_from_dir"]


def render_report(*args, **kw) -> str:
    from streamdp.report.render import render_report as _render
    return _render(*args, **kw)


def write_report(*args, **kw):
    from streamdp.report.render import write_report as _write
    return _write(*args, **kw)


def report_from_dir(snapshot_dir, out, *, vocabulary=None, **kw):
    """Write the report of a snapshot folder (or one snapshot file) to ``out``; returns the path.
    ``vocabulary``: a Vocabulary or a file (default: vocabulary.txt next to the snapshots)."""
    from streamdp.report.load import load_vocabulary, snapshots_from_path
    snaps = snapshots_from_path(snapshot_dir)
    if vocabulary is None or isinstance(vocabulary, (str, bytes)) or hasattr(vocabulary, "__fspath__"):
        vocabulary = load_vocabulary(vocabulary, near=snapshot_dir)
    return write_report(snaps, vocabulary, out, source=str(snapshot_dir), **kw)
