"""Benchmarks that cannot rot (issue 24): every script under benchmarks/ runs on a tiny size.

benchmarks/e2e.py had rotted: it held partitions with a pause reason the metrics reject and
crashed at its first loop, unnoticed, because nothing ran it. Here each script runs as an
operator would (a subprocess, its own arguments, this checkout's code), at a size that
takes seconds, and must exit 0 and print its table. A new script without an entry in
:data:`SMOKE_ARGS` fails :func:`test_every_benchmark_script_has_a_smoke_run`.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamdp import StreamingSpectralLDA

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DEBIAN_LIST = "{debian_list}"       # replaced by a tiny synthetic Translation-en list

#: script -> tiny arguments (a string: the test that runs it instead). samplers.py checks each
#: sampler's standard deviation within 5 %: 20,000 draws put that 10 standard errors away.
SMOKE_ARGS: dict[str, list[str] | str] = {
    "blt_params.py": ["--nbuf", "2"],
    "compare.py": "tests/test_evaluation.py::test_compare_smoke_run (--smoke)",
    "continual.py": ["--releases", "4", "--mechanisms", "tree", "--seeds", "1", "--all-steps", "4",
                     "--d", "200", "--k", "5", "--warmup", "2000", "--stream", "4000"],
    "continual_refine.py": ["--releases", "4", "--seeds", "0", "--limit", "300", "--k", "3",
                            "--debian-list", DEBIAN_LIST],
    "dedup.py": ["--ids", "2000", "--batch", "500"],
    "docs_needed.py": ["--smoke", "--seeds", "0", "--fractions", "0.5,1.0", "--target", "2",
                       "--debian-list", DEBIAN_LIST],
    "e2e.py": ["--processes", "1", "--partitions", "3", "--docs", "3000", "--d", "500", "--k", "5",
               "--batch", "500", "--timeout", "120"],
    "e2e.py --decode": ["--decode", "--docs", "2000", "--d", "500", "--k", "5", "--batch", "500"],
    "pipeline.py": ["--docs", "2000", "--d", "500", "--k", "5", "--inputs", "counts",
                    "--batch", "500", "--timeout", "120"],
    "postprocess.py": ["--corpora", "debian", "--seeds", "0", "--epsilons", "4", "--k", "3",
                       "--variants", "landed,js,fission_js,js_eb_pooled",
                       "--debian-list", DEBIAN_LIST],
    "recovery.py": ["--tables", "main", "--seeds", "1", "--d", "200", "--k", "5",
                    "--warmup", "2000", "--stream", "4000", "--sizes", "2000"],
    "release_latency.py": ["--d", "500", "--k", "5", "--warmup-docs", "200", "--stream-docs", "200"],
    "release_poll.py": ["--epochs", "2", "--partitions", "2", "--state-kb", "4", "--polls", "1"],
    "samplers.py": ["--n", "20000", "--opendp-n", "20000", "--repeats", "1", "--workers", "1"],
    "service_start.py": ["--corpora", "debian", "--epsilons", "4", "--seeds", "0", "--releases", "4",
                         "--k", "3", "--limit", "400", "--public-docs", "60",
                         "--debian-list", DEBIAN_LIST],
    "start_quick.py": ["--epsilons", "4", "--seeds", "0", "--k", "3", "--debian-list", DEBIAN_LIST],
    "stream_size.py": ["--sizes", "300", "--seeds", "0", "--k", "3", "--debian-list", DEBIAN_LIST],
    "stream_size.py --start tensor": ["--sizes", "300", "--seeds", "0", "--k", "3", "--start",
                                      "tensor", "--debian-list", DEBIAN_LIST],
    "throughput.py": ["--d", "500", "--k", "5", "--docs", "2000", "--batch", "500", "--refine", "0,1",
                      "--sections", "grid"],
    "trend_alerts.py": ["--seeds", "1", "--epochs", "14", "--per-epoch", "300", "--change-at", "12",
                        "--aggregators", "blt"],
    "user_level.py": ["--stream-docs", "2000", "--epsilons", "4", "--m", "1", "--schedules", "uniform",
                      "--seeds", "0", "--d", "200", "--k", "5"],
    "vocabulary.py": ["--smoke"],
}

#: smoke run -> fields its --json output must hold. stream_size.py run as a user runs it (no
#: --start) measures the start streamdp.fit picks, i.e. the estimator's default.
SMOKE_JSON: dict[str, dict] = {
    "stream_size.py": {"start": inspect.signature(StreamingSpectralLDA).parameters["start"].default},
}


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_benchmark_script_has_a_smoke_run():
    covered = {name.split()[0] for name in SMOKE_ARGS}
    assert set(_scripts()) == covered, (
        f"benchmarks without a smoke run: {sorted(set(_scripts()) - covered)}; "
        f"entries for scripts that are gone: {sorted(covered - set(_scripts()))}")


def _debian_list(path: Path) -> Path:
    """A tiny Translation-en list in Debian's format: 400 descriptions drawn from 4 themes."""
    import numpy as np
    rng = np.random.default_rng(0)
    themes = [[f"{t}{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(40)] for t in ("net", "font", "game", "lib")]
    out = []
    for n in range(400):
        words = rng.choice(themes[n % 4], size=60).tolist() + rng.choice(themes[(n + 1) % 4], size=10).tolist()
        out.append(f"Package: pkg{n}\nDescription-md5: {n:032x}\nDescription-en: {' '.join(words[:6])}\n"
                   + "".join(f" {' '.join(words[i:i + 12])}\n" for i in range(6, len(words), 12)))
    path.write_text("\n".join(out))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, a in SMOKE_ARGS.items() if isinstance(a, list)])
def test_benchmark_runs_on_a_tiny_size(name, tmp_path):
    script = name.split()[0]
    deb = None
    args = []
    for a in SMOKE_ARGS[name]:
        if a == DEBIAN_LIST:
            deb = deb or _debian_list(tmp_path / "Translation-en")
            a = str(deb)
        args.append(a)
    out = tmp_path / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MPLBACKEND": "Agg",
           # this checkout's streamdp, also in spawned workers (not an installed copy)
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if "--json" not in args:
        args += ["--json", str(out)]
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{name} crashed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "|---" in proc.stdout, f"{name} printed no table:\n{proc.stdout[-3000:]}"
    if name in SMOKE_JSON:
        written = json.loads(out.read_text())
        assert {f: written.get(f) for f in SMOKE_JSON[name]} == SMOKE_JSON[name]
