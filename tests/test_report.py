"""`streamdp report`: the HTML page from real snapshots, rendered in a real headless Chromium.

The snapshots come from the estimator in continual mode with refinement (the path the release
service runs) on the demo's readable corpus. The browser test loads the page from file:// with
every request recorded and anything but the page itself aborted, checks the charts drew (one
bar chart per topic with one bar per word, the budget chart, the across-releases chart), that
the screenshot is not blank, and keeps the PNG in $STREAMDP_TEST_ARTIFACTS (default
test-artifacts/). Without Chromium it skips, unless STREAMDP_REQUIRE_BROWSER=1 (CI) makes it
fail.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streamdp import RefinementConfig, StreamingSpectralLDA
from streamdp.privacy.conversions import zcdp_epsilon
from streamdp.privacy.epochs import EpochClock
from streamdp.report.analysis import budget_series, follow_topics, link_releases, order_releases
from streamdp.report.load import ReportInputError, load_snapshots, load_vocabulary, open_source
from streamdp.report.render import render_report
from streamdp.services.demo_corpus import sample_texts
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary

CHROMIUM = os.environ.get("STREAMDP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
K, EPOCHS, N_WORDS = 6, 4, 10
REPO = Path(__file__).resolve().parents[1]


def artifacts_dir() -> Path:
    out = Path(os.environ.get("STREAMDP_TEST_ARTIFACTS") or REPO / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


def make_snapshots(epsilon: float | None, n_warmup=6000, n_stream=12000, seed=0, epochs=EPOCHS):
    """Continual releases (epoch 1 spectral, 2.. refined: refinement model lag 1, each epoch
    folded into the previous snapshot) of the demo corpus, and its vocabulary."""
    texts, _, words = sample_texts(n_warmup + n_stream, seed=seed)
    vocab = Vocabulary(words)
    X, _ = vocab.vectorize([t.split() for t in texts])
    clock = EpochClock(stream_start=1000.0, epoch_seconds=10.0)
    est = StreamingSpectralLDA(K, 1.0, epsilon=epsilon, delta=1e-6, seed=seed, sampler="fast", non_production=True,
                               epochs=clock, horizon=epochs,
                               refinement=RefinementConfig(model_lag=1))
    est.warmup(X[:n_warmup])
    ts = 1000.0 + np.sort(np.random.default_rng(seed + 1).uniform(0, epochs * 10.0, n_stream))
    snaps = []
    for e in range(epochs):
        m = (ts >= 1000 + e * 10) & (ts < 1000 + (e + 1) * 10)
        est.partial_fit(X[n_warmup:][m], ts[m])
        snaps += est.close_epochs(1000 + (e + 1) * 10)
    return snaps, vocab


def write_dir(path: Path, snaps, vocab) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for s in snaps:
        (path / f"epoch-{s.epoch:06d}-{s.release_id}.msgpack").write_bytes(s.to_bytes())
    vocab.save(path / "vocabulary.txt")
    return path


@pytest.fixture(scope="module")
def private_dir(tmp_path_factory):
    snaps, vocab = make_snapshots(epsilon=2.0)
    assert [s.stage for s in snaps] == ["spectral"] + ["refined"] * (EPOCHS - 1)
    return write_dir(tmp_path_factory.mktemp("snapshots"), snaps, vocab)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "streamdp", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


# ------------------------------------------------------------------ the browser test
def browser():
    """Playwright's sync API and the chromium path, or skip/fail (STREAMDP_REQUIRE_BROWSER=1)."""
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install -e '.[test]')"
    if why is None and not Path(CHROMIUM).is_file():
        why = f"no Chromium at {CHROMIUM} (apt-get install -y chromium; .ci/run does)"
    if why is not None:
        if os.environ.get("STREAMDP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"STREAMDP_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    return sync_playwright


@pytest.fixture(scope="module")
def sync_playwright():
    return browser()        # module scope, before private_dir: no snapshots made for a skip


def test_report_renders_in_headless_chromium_with_no_network(sync_playwright, private_dir, tmp_path):
    out = tmp_path / "report.html"
    r = cli("report", str(private_dir), "--out", str(out), "-n", str(N_WORDS))
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout and out.is_file()
    page_url = out.resolve().as_uri()

    requests, errors = [], []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = b.new_context(viewport={"width": 1280, "height": 900})
            # every request is recorded; anything but the page itself is refused
            ctx.route("**/*", lambda route: route.continue_() if route.request.url == page_url
                      else route.abort())
            ctx.on("request", lambda req: requests.append(req.url))
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(page_url, wait_until="load")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 8",
                                   timeout=30_000)
            count = page.evaluate
            # one bar chart per topic, one bar per word, each bar drawn with a width
            assert count("document.querySelectorAll('.topic-card').length") == K
            assert count("document.querySelectorAll('.topic-card .js-plotly-plot').length") == K
            bars = count("""Array.from(document.querySelectorAll('.topic-card .js-plotly-plot'))
                .map(d => Array.from(d.querySelectorAll('.bars .point path'))
                          .filter(p => p.getBBox().width > 0).length)""")
            assert bars == [N_WORDS] * K
            # the previous release's ticks (epoch 3 on epoch 4's bars)
            ticks = count("""Array.from(document.querySelectorAll('.topic-card .js-plotly-plot'))
                .map(d => d.querySelectorAll('.scatterlayer .point').length)""")
            assert ticks == [N_WORDS] * K
            # the budget chart: ρ of the warm-up and stream groups, ρ budget; ε of the
            # most-charged document and of the stream documents, ε budget
            # (no vocabulary selection here: its line is left out); a marker per release on
            # the spends, every line drawn across the releases
            traces = count("""Array.from(document.querySelectorAll('#privacy-budget .scatterlayer .trace'))
                .map(t => [t.querySelectorAll('.points .point').length,
                           t.querySelector('path.js-line') ? t.querySelector('path.js-line').getBBox().width : 0])""")
            assert [m for m, _ in traces] == [EPOCHS, EPOCHS, 0, EPOCHS, EPOCHS, 0], traces
            assert min(w for _, w in traces) > 300, traces
            # across releases: drift (from epoch 2), α and noise-to-signal per topic
            assert count("document.querySelectorAll('#topics-across-releases .scatterlayer .trace').length") == 3 * K
            # topic trends (issue 27): per topic a band and a line with a point per refined
            # release (epochs 2 … EPOCHS: epoch 1 is not refined)
            lines = count("""Array.from(document.querySelectorAll('#topic-trends .scatterlayer .trace'))
                .map(t => t.querySelectorAll('.points .point').length)""")
            assert lines.count(EPOCHS - 1) >= K, lines
            bands = count("""Array.from(document.querySelectorAll('#topic-trends .scatterlayer .trace path.js-fill'))
                .filter(p => p.getBBox().width > 0).length""")
            assert bands >= K, bands
            assert "Bonferroni" in page.inner_text("#trends + p")
            # issue 27 visuals: no toolbar on the topic cards (it covered the first bar), one
            # x scale shared by every card
            assert count("document.querySelectorAll('.topic-card .modebar').length") == 0
            ranges = count("""Array.from(document.querySelectorAll('.topic-card .js-plotly-plot'))
                .map(d => d._fullLayout.xaxis.range.map(v => v.toFixed(6)).join(','))""")
            assert len(set(ranges)) == 1, ranges
            trends_png = page.locator("#topic-trends").screenshot()
            # the plain-words privacy report
            text = page.inner_text("dl.plain")
            for needle in ("Guarantee", "(2, 1e-06)-differential privacy", "Unit of privacy",
                           "one document", "add/remove one document", "ε = 2", "Spent so far",
                           "What is public"):
                assert needle in text, needle
            assert "refinement" in page.inner_text("#identity")
            png = page.screenshot(full_page=True)
            chart_png = page.locator(".topic-card").first.screenshot()
        finally:
            b.close()
    (artifacts_dir() / "report.png").write_bytes(png)
    (artifacts_dir() / "report-trends.png").write_bytes(trends_png)
    assert not errors, errors
    assert requests == [page_url], [u for u in requests if u != page_url]

    from PIL import Image
    img = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)
    assert img.shape[1] == 1280 and img.shape[0] > 2000
    assert img.std() > 20, img.std()                    # not a blank page
    card = np.asarray(Image.open(io.BytesIO(chart_png)).convert("RGB"), dtype=int)
    colourful = (card.max(axis=2) - card.min(axis=2)) > 60   # the bars' colour, not grey text
    assert colourful.mean() > 0.03, colourful.mean()


# ------------------------------------------------------------------ content, no browser
def test_topics_followed_by_refinement_and_by_matching():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    base = rng.dirichlet(np.full(30, 0.3), size=4)
    a = TopicSnapshot(base, np.ones(4), np.ones(4), 100.0, {}, "tensor", "S", epoch=1)
    perm = np.array([2, 0, 3, 1])
    # a spectral release with permuted topics: matching finds the permutation
    b = TopicSnapshot(base[perm], np.ones(4), np.ones(4), 100.0, {}, "tensor", "S", epoch=2)
    link = link_releases(a, b)
    assert link.method == "matched" and link.previous == perm.tolist()
    # the same rows as a refined release of the same subspace: identity by index, and the
    # report can say that matching disagrees on every topic
    c = TopicSnapshot(base[perm], np.ones(4), np.ones(4), 100.0, {}, "tensor", "S", epoch=2,
                      stage="refined")
    link = link_releases(a, c)
    assert link.method == "refinement" and link.previous == [0, 1, 2, 3]
    assert link.disagreements == [0, 1, 2, 3]
    # a different number of topics cannot be followed
    d = TopicSnapshot(base[:3], np.ones(3), np.ones(3), 100.0, {}, "tensor", "S", epoch=3)
    assert link_releases(b, d).method is None

    # words entering and leaving, and the drift, exactly
    t1 = np.zeros((2, 30)); t1[0, [0, 1, 2]] = [0.5, 0.3, 0.2]; t1[1, [10, 11, 12]] = [0.4, 0.35, 0.25]
    t2 = t1.copy(); t2[0] = 0; t2[0, [0, 1, 3]] = [0.5, 0.3, 0.2]
    s1 = TopicSnapshot(t1, np.ones(2), np.ones(2), 1.0, {}, "tensor", "S", epoch=1)
    s2 = TopicSnapshot(t2, np.ones(2), np.ones(2), 1.0, {}, "tensor", "S", epoch=2, stage="refined")
    links, hist = follow_topics([s1, s2], words, n_words=3)
    step = hist[0].steps[-1]
    assert step.entered == ["w3"] and step.left == ["w2"] and step.drift == pytest.approx(0.2)
    assert hist[1].steps[-1].entered == [] and hist[1].steps[-1].drift == 0.0


def test_budget_series_and_plain_words_read_the_accountant(private_dir):
    snaps, _ = order_releases(load_snapshots(open_source(private_dir)))
    points = budget_series(snaps)
    assert [p.x for p in points] == [1.0, 2.0, 3.0, 4.0]
    for p, s in zip(points, snaps):
        acc = s.privacy["accountant"]
        assert p.rho_spent == acc["rho_worst_case"] and p.rho_budget == acc["rho_budget"]
        assert p.rho_by_atom["stream documents (worst epoch)"] == acc["rho_by_atom"]["stream_worst_epoch_rho"]
        assert p.rho_spent <= p.rho_budget * (1 + 1e-9)
        # the stream's ε is the accountant's own conversion of its ρ
        assert p.epsilon_stream == pytest.approx(zcdp_epsilon(p.rho_by_atom[
            "stream documents (worst epoch)"], 1e-6), rel=1e-12)
        assert p.epsilon_stream <= p.epsilon_spent <= 2.0 + 1e-9
    # the stream's spend grows release by release (continual release charges each epoch)
    stream = [p.rho_by_atom["stream documents (worst epoch)"] for p in points]
    assert stream == sorted(stream) and stream[0] < stream[-1]


def test_republished_snapshots_count_once_and_last_limits(private_dir):
    snaps = load_snapshots(open_source(private_dir))
    vocab = load_vocabulary(None, open_source(private_dir))
    ordered, dropped = order_releases(snaps + snaps[-1:])
    assert dropped == 1 and [s.epoch for s in ordered] == [1, 2, 3, 4]
    html = render_report(snaps + snaps[-1:], vocab, source="x", last=2)
    assert "2 releases read (epoch 3 → epoch 4)" in html


def test_non_private_snapshots_say_so(tmp_path):
    snaps, vocab = make_snapshots(epsilon=None, n_warmup=3000, n_stream=4000)
    html = render_report(snaps, vocab, source="x")
    assert 'id="non-private"' in html and "No privacy guarantee" in html
    assert 'id="no-budget"' in html and 'id="privacy-budget"' not in html
    assert "(noised)" not in html


def test_page_is_self_contained_and_escapes_words(private_dir):
    snaps = load_snapshots(open_source(private_dir))
    vocab = load_vocabulary(None, open_source(private_dir))
    evil = Vocabulary(["<script>alert(1)</script>" if w == vocab.words[0] else w
                       for w in vocab.words])
    for s in snaps:            # the estimator's snapshots carry no vocabulary id
        assert s.vocabulary_id is None
    html = render_report(snaps, evil, source="<b>x</b>")
    assert "<script>alert(1)" not in html and "<b>x</b>" not in html
    # plotly.js (its basic bundle) inlined exactly once; the rest refers to nothing outside it
    from streamdp.report.render import plotly_js
    js = plotly_js()[0]
    assert html.count(js) == 1
    rest = html.replace(js, "")
    for needle in ("src=", "href=", "@import", "url(", "<link", "<iframe", "http://", "https://"):
        assert needle not in rest, needle


def test_rendering_does_not_import_kafka():
    r = subprocess.run([sys.executable, "-c", "import sys, streamdp.report.render, streamdp.report; "
                        "print(sorted(m for m in sys.modules if 'kafka' in m))"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_bad_input_is_one_line_not_a_traceback(private_dir, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "latest.json").write_text('{"release_id": "x"}')
    wrong_vocab = tmp_path / "v.txt"
    Vocabulary(["alpha", "beta", "gamma"]).save(wrong_vocab)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [((str(tmp_path / "missing"),), "no snapshot folder or file"),
             ((str(tmp_path / "notes.txt"),), "not a readable streamdp topic snapshot"),
             ((str(tmp_path / "latest.json"),), "is JSON, not a snapshot"),
             ((str(empty),), "no snapshots in"),
             ((str(private_dir), "--vocabulary", str(wrong_vocab)), "words per topic"),
             ((str(private_dir), "--vocabulary", str(tmp_path / "nope.txt")), "no vocabulary file"),
             ((str(private_dir), "--bootstrap", "127.0.0.1:1"), "not both"),
             (("--bootstrap", "127.0.0.1:1", "--vocabulary", str(wrong_vocab), "--timeout", "1"),
              "bootstrap")]
    from streamdp.cli import main
    for args, needle in cases:         # in-process: main() is what the command line runs
        assert main(["report", *args, "--out", str(tmp_path / "r.html")]) == 2, args
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, err)
    assert not (tmp_path / "r.html").exists()
    # and once through a real process: exit status 2, one line, no traceback
    r = cli("report", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "r.html"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    with pytest.raises(ReportInputError, match="--vocabulary"):
        load_vocabulary(None, open_source(empty))


def test_report_from_the_snapshots_topic(kafka_broker, kafka_topics, private_dir, tmp_path):
    """The snapshots topic (as the release service publishes: key = release id), with a
    re-publication of the last snapshot, reads as the folder does."""
    from confluent_kafka import Producer

    from streamdp.kafka.topics import client_config
    snaps = sorted(load_snapshots(open_source(private_dir)), key=lambda s: s.epoch)
    p = Producer(client_config(kafka_broker.bootstrap, "producer"))
    for s in snaps + snaps[-1:]:
        p.produce(kafka_topics.snapshots, key=s.release_id.encode(), value=s.to_bytes())
    assert p.flush(30) == 0
    out = tmp_path / "topic.html"
    r = cli("report", "--bootstrap", kafka_broker.bootstrap, "--topic", kafka_topics.snapshots,
            "--vocabulary", str(private_dir / "vocabulary.txt"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "4 releases read (epoch 1 → epoch 4)" in html     # the re-publication counted once
    assert snaps[-1].release_id in html
    # the topic does not carry the vocabulary: without --vocabulary, a message
    r = cli("report", "--bootstrap", kafka_broker.bootstrap, "--topic", kafka_topics.snapshots)
    assert r.returncode == 2 and "--vocabulary" in r.stderr and "Traceback" not in r.stderr


def test_report_from_the_release_service_over_http(private_dir, tmp_path, capsys):
    """http://HOST:PORT reads the latest release and the vocabulary as the release service
    serves them (GET /snapshot/latest.msgpack, /vocabulary.txt)."""
    import http.server
    import threading

    from streamdp.cli import main
    latest = max(load_snapshots(open_source(private_dir)), key=lambda s: s.epoch)
    bodies = {"/snapshot/latest.msgpack": latest.to_bytes(),
              "/vocabulary.txt": (private_dir / "vocabulary.txt").read_bytes()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body if body is not None else b'{"routes": []}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        out = tmp_path / "http.html"
        assert main(["report", url, "--out", str(out)]) == 0, capsys.readouterr().err
    finally:
        server.shutdown()
    html = out.read_text()
    assert "1 release read (epoch 4 → epoch 4)" in html and latest.release_id in html
    assert html.count('class="card topic-card"') == K


def test_report_shows_distinct_topics_first_with_the_count(private_dir):
    """Issue 22: the report says how many topics can be told apart (released values only) and
    lists the distinct topics first, the others marked background / near-copy."""
    import re

    snaps = load_snapshots(open_source(private_dir))
    vocab = load_vocabulary(None, open_source(private_dir))
    latest = max(snaps, key=lambda s: s.epoch)
    html = render_report(snaps, vocab, source="x")
    assert (f"{latest.n_distinct} of {latest.n_topics} topics can be told apart at this budget"
            in html)
    order = [int(i) for i in re.findall(r'class="card topic-card" data-topic="(\d+)"', html)]
    kinds = [latest.topic_flags[i].kind for i in order]
    assert sorted(order) == list(range(latest.n_topics))
    assert kinds == sorted(kinds, key=lambda k: k != "distinct")
    n_marked = html.count('class="badge flag-background"') + html.count('class="badge flag-near-copy"')
    assert n_marked == latest.n_topics - latest.n_distinct


def test_report_marks_topics_that_moved_more_than_half_their_mass(private_dir):
    """A release whose snapshot marks topic 1 as new (topic_change > ½) shows it as new."""
    import dataclasses

    snaps = sorted(load_snapshots(open_source(private_dir)), key=lambda s: s.epoch)
    vocab = load_vocabulary(None, open_source(private_dir))
    change = np.zeros(snaps[-1].n_topics)
    change[1] = 0.8
    marked = snaps[:-1] + [dataclasses.replace(snaps[-1], topic_change=change)]
    html = render_report(marked, vocab, source="x")
    assert html.count('class="badge flag-new"') == 1
    calm = snaps[:-1] + [dataclasses.replace(snaps[-1], topic_change=np.zeros_like(change))]
    assert 'class="badge flag-new"' not in render_report(calm, vocab, source="x")


def test_a_page_of_16_releases_stays_under_1_5_mb_with_one_plotly(tmp_path):
    """Issue 27: 4 releases weighed 4.9 MB (the full plotly.js); the page inlines plotly.js's
    basic bundle once (scatter and bar are all it draws) and stays under 1.5 MB at 16 releases."""
    snaps, vocab = make_snapshots(epsilon=2.0, n_warmup=4000, n_stream=16 * 1500, epochs=16)
    assert len(snaps) == 16
    html = render_report(snaps, vocab, source="x")
    size = len(html.encode("utf-8"))
    assert size <= 1_500_000, size
    assert html.count("plotly.js (basic - minified)") == 1
    assert html.count("Copyright 2012-") == 1            # one copy of plotly.js, no other
    print(f"report of 16 releases: {size:,} bytes")


def test_the_vendored_plotly_bundle_is_plotly_py_s_own_version():
    """The basic bundle must be of the plotly.js major version plotly.py generates figures for
    (vendored: 4.1.1, plotly 7.1's own): after a major upgrade of plotly, replace streamdp/report/vendor/plotly-basic.min.js (npm package
    plotly.js-basic-dist-min of the version printed here)."""
    import re as _re

    import plotly.offline
    from streamdp.report.render import plotly_js
    full = _re.search(r"plotly\.js v([0-9.]+)", plotly.offline.get_plotlyjs()[:400]).group(1)
    # figures are compatible within a major version (a newer plotly may bundle a newer minor)
    assert plotly_js()[1].split(".")[0] == full.split(".")[0], (plotly_js()[1], full)


def test_plain_words_name_the_sampler_not_its_id(private_dir):
    snaps = load_snapshots(open_source(private_dir))
    vocab = load_vocabulary(None, open_source(private_dir))
    html = render_report(snaps, vocab, source="x")
    plain = html[html.index('<dl class="plain">'):html.index("</dl>")]
    assert "numpy-pcg64" not in plain and "the fast sampler" in plain, plain[-2000:]
