"""The HTML page: Plotly figures (plotly.js inlined once, nothing loaded from the network) in a
jinja2 template. Pure: snapshots and a vocabulary in, one self-contained HTML string out."""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
from pathlib import Path

import jinja2
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from streamdp import trends as _trends
from streamdp.privacy.report import describe, is_non_private
from streamdp.report.analysis import (ATOM_NAMES, budget_series, check_vocabulary,
                                      follow_topics, noise_level, order_releases, release_label)
from streamdp.report.load import ReportInputError
from streamdp.snapshot import TopicSnapshot

#: one colour per topic (Plotly's qualitative palette, cycled)
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692",
           "#B6E880", "#FF97FF", "#FECB52")
#: figure options: no Plotly logo, no cloud button, resize with the page
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["sendDataToCloud"]}
#: the small per-topic bar charts: no toolbar at all (it covered the first bar)
CARD_CONFIG = {"displayModeBar": False, "responsive": True}
#: plotly.js's official "basic" bundle (scatter, bar, pie: all the report draws), 1.2 MB instead
#: of the full 4.8 MB, so a page stays under 1.5 MB (issue 27); MIT, vendor/plotly-basic.LICENSE.
#: Its version is plotly.py's own plotly.js version (tests/test_report.py checks it)
PLOTLY_BASIC = Path(__file__).with_name("vendor") / "plotly-basic.min.js"


def plotly_js() -> tuple[str, str]:
    """(the plotly.js source to inline, its version)."""
    js = PLOTLY_BASIC.read_text(encoding="utf-8")
    m = re.search(r"plotly\.js \(basic - minified\) v([0-9.]+)", js[:300])
    return js, (m.group(1) if m else "?")
#: words-entered/left rows shown per topic (the charts show every release)
MAX_CHANGE_ROWS = 8

_env = jinja2.Environment(loader=jinja2.PackageLoader("streamdp.report", "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)


def _div(fig: go.Figure, div_id: str, config: dict = PLOT_CONFIG) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config=config,
                       div_id=div_id, default_width="100%")


def _layout(fig: go.Figure, height: int, **kw) -> go.Figure:
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=kw.pop("top", 10), b=30),
                      template="plotly_white", font=dict(size=12), **kw)
    return fig


def topic_bar_figure(history, colour: str, x_max: float | None = None) -> go.Figure:
    """The latest release's top words of one topic as bars; the previous release's
    probabilities of the same words as markers (drift at a glance)."""
    step = history.steps[-1]
    words = [w for w, _ in step.top_words][::-1]            # most probable at the top
    probs = [p for _, p in step.top_words][::-1]
    fig = go.Figure(go.Bar(x=probs, y=words, orientation="h", marker_color=colour,
                           name=step.label, hovertemplate="%{y}: p = %{x:.4f}<extra></extra>"))
    if step.previous_p is not None:
        prev = history.steps[-2]
        fig.add_trace(go.Scatter(
            x=step.previous_p[::-1], y=words, mode="markers", name=prev.label,
            marker=dict(symbol="line-ns-open", size=14, color="#222", line=dict(width=2)),
            hovertemplate=f"%{{y}} in {prev.label}: p = %{{x:.4f}}<extra></extra>"))
    # one x scale for every card (x_max: the largest probability shown on any card)
    xaxis = dict(title=None, tickformat=".2f", rangemode="tozero")
    if x_max:
        xaxis["range"] = [0.0, x_max * 1.05]
    return _layout(fig, 40 + 22 * len(words), showlegend=False, xaxis=xaxis,
                   yaxis=dict(automargin=True))


def drift_figure(histories) -> go.Figure | None:
    """Per topic across releases: drift (total variation to the previous release), α and the
    noise-to-signal estimate. None when there is only one release."""
    if max(len(h.steps) for h in histories) < 2:
        return None
    any_noise = any(s.noise_to_signal is not None for h in histories for s in h.steps)
    rows = 3 if any_noise else 2
    titles = ["drift: share of the topic's probability mass that moved since the previous release",
              "α (topic weight)"] + (["estimated noise-to-signal (above 1: mostly noise)"] if any_noise else [])
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.09,
                        subplot_titles=titles)
    for h in histories:
        colour = PALETTE[h.topic % len(PALETTE)]
        name = f"topic {h.topic}: " + " ".join(w for w, _ in h.steps[-1].top_words[:3])
        xs = [s.x for s in h.steps]
        labels = [f"{s.label}, index {s.topic}" for s in h.steps]
        common = dict(legendgroup=name, line=dict(color=colour), mode="lines+markers",
                      customdata=labels)
        fig.add_trace(go.Scatter(x=xs[1:], y=[s.drift for s in h.steps[1:]], name=name,
                                 customdata=labels[1:],
                                 hovertemplate="%{customdata}: moved %{y:.1%}<extra></extra>",
                                 **{k: v for k, v in common.items() if k != "customdata"}),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[s.alpha for s in h.steps], name=name, showlegend=False,
                                 hovertemplate="%{customdata}: α = %{y:.3f}<extra></extra>",
                                 **common), row=2, col=1)
        if any_noise:
            fig.add_trace(go.Scatter(
                x=xs, y=[None if s.noise_to_signal is None or not math.isfinite(s.noise_to_signal)
                         else s.noise_to_signal for s in h.steps], name=name, showlegend=False,
                hovertemplate="%{customdata}: noise/signal = %{y:.3f}<extra></extra>", **common),
                row=3, col=1)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="epoch", row=rows, col=1, dtick=1)
    return _layout(fig, 180 * rows + 60, top=30, legend=dict(orientation="h", y=-0.12))


def trends_figure(tr, histories) -> go.Figure | None:
    """Each topic's share of the epochs a release added, with its interval as a band;
    significant changes (streamdp.trends) as open circles. None when no release has a share."""
    pts = [p for p in tr.points if p.valid and p.epoch is not None]
    if not pts:
        return None
    names = {h.topic: f"topic {h.topic}: " + " ".join(w for w, _ in h.steps[-1].top_words[:3])
             for h in histories}
    sig = {(c.epoch, c.topic) for c in tr.significant}
    fig = go.Figure()
    xs = [p.epoch for p in pts]
    for i in range(pts[-1].share.shape[0]):
        colour = PALETTE[i % len(PALETTE)]
        name = names.get(i, f"topic {i}")
        lo = [round(float(p.lower[i]), 4) for p in pts]
        hi = [round(float(p.upper[i]), 4) for p in pts]
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=hi + lo[::-1], fill="toself", mode="lines",
                                 line=dict(width=0), fillcolor=colour, opacity=0.2,
                                 legendgroup=name, showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=xs, y=[round(float(p.share[i]), 4) for p in pts], name=name, legendgroup=name,
            mode="lines+markers", line=dict(color=colour), customdata=list(zip(lo, hi)),
            hovertemplate="epoch %{x}: %{y:.1%} (%{customdata[0]:.1%}–%{customdata[1]:.1%})"
                          "<extra>" + name + "</extra>"))
        marks = [p for p in pts if (p.epoch, i) in sig]
        if marks:
            fig.add_trace(go.Scatter(
                x=[p.epoch for p in marks], y=[round(float(p.share[i]), 4) for p in marks],
                mode="markers", legendgroup=name, showlegend=False, hoverinfo="skip",
                marker=dict(symbol="circle-open", size=16, color=colour, line=dict(width=2))))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", title_text="share of the epoch")
    fig.update_xaxes(title_text="epoch", dtick=1)
    return _layout(fig, 380, top=10, legend=dict(orientation="h", y=-0.2))


def budget_figure(points) -> go.Figure | None:
    """ρ spent per group of documents and ε of the most-charged document, per release, against
    the budget. None without an accountant report (non-private snapshots)."""
    if not points:
        return None
    xs = [p.x for p in points]
    labels = [p.label for p in points]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=[
        "ρ (zCDP) spent by each group of documents; a document is charged only in its own group",
        "ε spent, at the budget's δ"])
    for i, name in enumerate(ATOM_NAMES.values()):
        ys = [p.rho_by_atom.get(name) for p in points]
        if all(not y for y in ys):          # a group this deployment does not have
            continue
        # lines that coincide stay visible: each group its own dash, marker and width
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, mode="lines+markers", customdata=labels,
                                 line=dict(color=("#636EFA", "#00CC96", "#AB63FA")[i],
                                           dash=("solid", "dot", "dashdot")[i], width=(4, 2, 2)[i]),
                                 marker=dict(symbol=("circle", "diamond", "square")[i],
                                             size=(9, 7, 6)[i]),
                                 hovertemplate="%{customdata}: ρ %{y:.4g}<extra>" + name + "</extra>"),
                      row=1, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[p.rho_budget for p in points], name="ρ budget",
                             mode="lines", line=dict(color="#EF553B", dash="longdash", width=1.5),
                             customdata=labels,
                             hovertemplate="%{customdata}: budget ρ %{y:.4g}<extra></extra>"),
                  row=1, col=1)
    if any(p.epsilon_spent is not None for p in points):
        fig.add_trace(go.Scatter(x=xs, y=[p.epsilon_spent for p in points],
                                 name="ε of the most-charged document (warm-up: charged once, in full)",
                                 mode="lines+markers", line=dict(color="#FFA15A", width=4),
                                 marker=dict(symbol="circle", size=9),
                                 customdata=labels,
                                 hovertemplate="%{customdata}: ε %{y:.3g}<extra></extra>"),
                      row=2, col=1)
    if any(p.epsilon_stream is not None for p in points):
        fig.add_trace(go.Scatter(x=xs, y=[p.epsilon_stream for p in points],
                                 name="ε spent (stream documents)", connectgaps=True,
                                 mode="lines+markers", line=dict(color="#00CC96", dash="dot", width=2),
                                 marker=dict(symbol="diamond", size=7),
                                 customdata=labels,
                                 hovertemplate="%{customdata}: ε %{y:.3g}<extra>stream</extra>"),
                      row=2, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[p.epsilon for p in points], name="ε budget", mode="lines",
                             line=dict(color="#EF553B", dash="longdash", width=1.5), customdata=labels,
                             hovertemplate="%{customdata}: budget ε %{y:.3g}<extra></extra>"),
                  row=2, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="epoch", row=2, col=1, dtick=1)
    return _layout(fig, 480, top=30, legend=dict(orientation="h", y=-0.15))


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _identity_summary(links) -> dict:
    by_method = {m: [l for l in links if l.method == m] for m in ("refinement", "matched")}
    refined = by_method["refinement"]
    disagree = [(i, l) for i, l in enumerate(links) if l.method == "refinement" and l.disagreements]
    return {"n_links": len(links), "n_refinement": len(refined), "n_matched": len(by_method["matched"]),
            "n_broken": sum(l.method is None for l in links),
            "n_agree": len(refined) - len(disagree), "disagree": disagree,
            "broken": [(i, l.reason) for i, l in enumerate(links) if l.method is None]}


def render_report(snapshots: list[TopicSnapshot], vocabulary, *, source: str, n_words: int = 10,
                  last: int | None = None, generated_at: float | None = None) -> str:
    """The report as one self-contained HTML page (plotly.js inlined)."""
    if not snapshots:
        raise ReportInputError(f"no snapshots in {source}")
    releases, republished = order_releases(snapshots)
    if last is not None:
        releases = releases[-last:]
    check_vocabulary(releases, vocabulary)
    words = vocabulary.words
    latest = releases[-1]
    links, histories = follow_topics(releases, words, n_words)
    points = budget_series(releases)

    topics = []
    x_max = max((max([p for _, p in h.steps[-1].top_words]
                     + [p for p in (h.steps[-1].previous_p or []) if p is not None], default=0.0)
                 for h in histories), default=0.0)
    flags = latest.topic_flags          # released values only (streamdp.evaluation.distinct)
    for h in histories:
        step = h.steps[-1]
        noise_text, noise_class = noise_level(step.noise_to_signal)
        changes = [s for s in h.steps[1:] if s.entered or s.left][-MAX_CHANGE_ROWS:]
        topics.append({
            "index": h.topic, "alpha": step.alpha, "noise_text": noise_text,
            "flag": flags[h.topic].kind, "copy_of": flags[h.topic].copy_of,
            "new": h.topic in latest.new_topics,
            "noise_class": noise_class, "noise_ratio": step.noise_to_signal,
            "headline": " ".join(w for w, _ in step.top_words[:3]),
            "div": _div(topic_bar_figure(h, PALETTE[h.topic % len(PALETTE)], x_max),
                        f"topic-{h.topic}", CARD_CONFIG),
            "followed_from": h.steps[0].label, "n_steps": len(h.steps),
            "drift_last": h.steps[-1].drift,
            "indices": [s.topic for s in h.steps],
            "changes": [{"label": s.label, "entered": s.entered, "left": s.left, "drift": s.drift}
                        for s in changes],
            "n_changes_hidden": max(0, sum(1 for s in h.steps[1:] if s.entered or s.left)
                                    - MAX_CHANGE_ROWS),
        })
    # distinct topics first (issue 22): what a reader can tell apart, then the rest
    topics.sort(key=lambda t: (t["flag"] != "distinct", t["index"]))
    drift = drift_figure(histories)
    tr = _trends.trends(releases)
    trend_fig = trends_figure(tr, histories)
    budget = budget_figure(points)
    privacy = latest.privacy if isinstance(latest.privacy, dict) else {}
    js, js_version = plotly_js()
    page = _env.get_template("report.html.j2").render(
        plotly_js=js, plotly_version=js_version,
        source=source, generated=_when(generated_at if generated_at is not None
                                       else _dt.datetime.now().timestamp()),
        latest={"release_id": latest.release_id, "label": release_label(latest, len(releases) - 1),
                "stage": latest.stage, "created": _when(latest.created_at),
                "n_docs": latest.n_docs, "k": latest.n_topics, "d": latest.topic_word.shape[1],
                "mechanism": latest.mechanism, "vocabulary_id": vocabulary.id,
                "quality_note": latest.quality_note,
                "distinct_line": (f"{latest.n_distinct} of {latest.n_topics} topics can be told "
                                  "apart at this budget" + (
                                      f", about {latest.documents_to_tell_apart:,.0f} more "
                                      "documents would help"
                                      if latest.documents_to_tell_apart else ""))},
        n_releases=len(releases), republished=republished,
        first_label=release_label(releases[0], 0), n_words=n_words,
        non_private=is_non_private(privacy), topics=topics,
        identity=_identity_summary(links), releases=[release_label(s, i) for i, s in enumerate(releases)],
        drift_div=None if drift is None else _div(drift, "topics-across-releases"),
        budget_div=None if budget is None else _div(budget, "privacy-budget"),
        trends_div=None if trend_fig is None else _div(trend_fig, "topic-trends"),
        trend_level=tr.level, trend_alpha=tr.alpha,
        trend_changes=[{"epoch": c.epoch, "topic": c.topic, "before": c.before, "after": c.after,
                        "z": c.z} for c in tr.significant],
        budget_last=points[-1] if points else None,
        plain_words=describe(privacy, n_docs=latest.n_docs),
        privacy_json=json.dumps(privacy, indent=1, default=_json_default, ensure_ascii=False))
    return page


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def write_report(snapshots: list[TopicSnapshot], vocabulary, out: str | Path, **kw) -> Path:
    """Render and write atomically; returns the path written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render_report(snapshots, vocabulary, **kw), encoding="utf-8")
    tmp.replace(out)
    return out
