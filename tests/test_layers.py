"""The package's layers, enforced (issue 26; docs/architecture.md, "Layers").

Every ``import`` of a streamdp module counts, wherever it is written: at module level, inside
a function, under ``if TYPE_CHECKING`` or in a ``try``. A function-level import still makes
the importing module depend on the imported one; hiding a cycle inside a function only moves
it to run time. The graph is read with ``ast`` from the source files, so nothing is imported.

Rules: every module has a layer; no import points to a higher layer; no import cycle, inside
a layer either; no module imports the package root ``streamdp`` (it re-exports the engine).

``python tests/test_layers.py`` prints the measures of issue 26: the largest strongly connected
component of the import graph, the number of function-level imports, files over 600 lines.
"""
from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "streamdp"

#: Lowest first. A module may import its own layer and the layers below it. An entry names a
#: module, or ``pkg.*`` for a package and everything in it; the longest match wins.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # pure numerics and data types: no noise draws, no I/O. privacy.rounding is here because
    # the sketches' compensated sums and its proven rounding bound are numerics the sketches use
    ("core", ("streamdp.errors", "streamdp.backoff", "streamdp.serialization", "streamdp.documents",
              "streamdp._counts_decode_kernel", "streamdp._fold_in_kernel", "streamdp._sum2_kernel",
              "streamdp._column_sum_kernel", "streamdp.refinement_sketch",
              "streamdp.refinement_topics", "streamdp.empirical_bayes", "streamdp.epoch_sums",
              "streamdp.moments.*", "streamdp.whitening", "streamdp.whitening.subspace",
              "streamdp.tensor", "streamdp.tensor.power_method", "streamdp.privacy.rounding",
              "streamdp.text", "streamdp.text.tokenizer", "streamdp.text.vocabulary",
              "streamdp.text.public_vocab", "streamdp.synthetic", "streamdp.snapshot",
              "streamdp.snapshot_summary", "streamdp.evaluation", "streamdp.evaluation.distinct",
              "streamdp.evaluation.matching", "streamdp.evaluation.metrics",
              "streamdp.evaluation.coherence", "streamdp.progress", "streamdp.start")),
    # sensitivities, the budget plan, events, accountant, ledgers, samplers, tree/BLT
    ("privacy", ("streamdp.privacy.*",)),
    # the private pipeline: warm-up, release, refinement, starts, continual, the estimator
    ("engine", ("streamdp", "streamdp.release", "streamdp.continual", "streamdp.estimator",
                "streamdp.estimator_one_shot", "streamdp.estimator_continual",
                "streamdp.estimator_params",
                "streamdp.continual_mechanism", "streamdp.aggregator_kinds",
                "streamdp.epoch_sketches",
                "streamdp.fitting", "streamdp.refinement", "streamdp.refinement_rule",
                "streamdp.cluster_start", "streamdp.public_start",
                "streamdp.whitening.warmup", "streamdp.tensor.private",
                "streamdp.text.vocab_selection", "streamdp.trends")),
    # messages, Kafka, HTTP metrics/health, packaged corpora
    ("io", ("streamdp.messages.*", "streamdp.kafka.*", "streamdp.observability.*",
            "streamdp.evaluation.corpora")),
    ("services", ("streamdp.services.*",)),
    # what a person runs: the CLI, the report, the demo, the snapshot reader library
    ("app", ("streamdp.cli.*", "streamdp.__main__", "streamdp.report.*", "streamdp.snapshots",
             "streamdp.services.demo", "streamdp.services.demo_corpus")),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def modules(src: Path) -> dict[str, Path]:
    """Dotted name → file of every module under ``src`` (the directory holding the package)."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


class Import:
    def __init__(self, importer: str, target: str, line: int, in_function: bool) -> None:
        self.importer, self.target, self.line, self.in_function = importer, target, line, in_function

    def __repr__(self) -> str:
        where = "function-level " if self.in_function else ""
        return f"{self.importer}:{self.line} {where}import of {self.target}"


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted name refers to (``pkg.mod.Class`` → ``pkg.mod``)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> list[Import]:
    """Every import of one streamdp module by another, function-level ones included."""
    out = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        in_function = {id(node) for fn in ast.walk(tree)
                       if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                       for node in ast.walk(fn)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:                       # relative: from . / .. import
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # ``from pkg import x``: x is a submodule or a name defined in pkg
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in {_known(t, mods) for t in targets if t.split(".")[0] == PACKAGE}:
                if target is not None and target != name:
                    out.append(Import(name, target, node.lineno, id(node) in in_function))
    return out


def layer_of(module: str) -> str | None:
    best, best_len = None, -1
    for layer, entries in LAYERS:
        for entry in entries:
            if entry.endswith(".*"):
                pkg = entry[:-2]
                hit = module == pkg or module.startswith(pkg + ".")
            else:
                hit = module == entry
            if hit and len(entry) > best_len:
                best, best_len = layer, len(entry)
    return best


def graph(edges: list[Import]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        g[e.importer].add(e.target)
    return g


def largest_cycle(mods: dict[str, Path], edges: list[Import]) -> list[str]:
    """The largest strongly connected component (Tarjan, iterative); one module: no cycle."""
    g = graph(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    best: list[str] = []
    for root in mods:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > len(best):
                        best = sorted(component)
    return best


def violations(src: Path) -> list[str]:
    """Every broken rule under ``src``, as one line each (empty: the layers hold)."""
    mods = modules(src)
    edges = imports(mods)
    out = [f"{m}: no layer (add it to LAYERS in tests/test_layers.py)"
           for m in mods if layer_of(m) is None]
    for e in edges:
        if e.target == PACKAGE:
            out.append(f"{e}: never import the package root (it imports the engine); "
                       "import the module that defines the name")
            continue
        lo, hi = layer_of(e.importer), layer_of(e.target)
        if lo is not None and hi is not None and RANK[hi] > RANK[lo]:
            out.append(f"{e}: upward, {lo} -> {hi}")
    try:
        graphlib.TopologicalSorter(graph(edges)).prepare()
    except graphlib.CycleError as exc:
        cycle = exc.args[1][::-1]    # graphlib lists predecessors first: reverse to importer order
        lines = {(e.importer, e.target): e for e in edges}
        out.append("import cycle: " + " -> ".join(cycle) + "  ("
                   + "; ".join(repr(lines[a, b]) for a, b in zip(cycle, cycle[1:])) + ")")
    return out


def test_the_package_keeps_its_layers():
    """No upward import, no cycle, no import of the package root, every module placed."""
    found = violations(ROOT)
    assert not found, "layer rules broken (docs/architecture.md, 'Layers'):\n" + "\n".join(found)


def test_every_layer_entry_names_a_module():
    """A renamed module must not leave a stale entry behind (it would place nothing)."""
    mods = modules(ROOT)
    for _, entries in LAYERS:
        for entry in entries:
            name = entry[:-2] if entry.endswith(".*") else entry
            assert name in mods, f"LAYERS names {entry!r}, which is not a module"


def _write(src: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return src


@pytest.mark.parametrize("files, expected", [
    # a cycle held together by a function-level import
    ({"streamdp/__init__.py": "", "streamdp/release.py": "from streamdp.privacy import plan\n",
      "streamdp/privacy/__init__.py": "",
      "streamdp/privacy/plan.py": "def f():\n    from streamdp.release import x\n"},
     ["upward, privacy -> engine", "import cycle"]),
    # an upward import of a name (not a module) from a service module, relative form
    ({"streamdp/__init__.py": "", "streamdp/kafka/__init__.py": "",
      "streamdp/kafka/topics.py": "def g():\n    from ..services.config import ConfigError\n",
      "streamdp/services/__init__.py": "", "streamdp/services/config.py": "ConfigError = 1\n"},
     ["streamdp.kafka.topics:2 function-level import of streamdp.services.config: upward, io -> services"]),
    # the package root, imported for its file path
    ({"streamdp/__init__.py": "", "streamdp/privacy/__init__.py": "",
      "streamdp/privacy/noise.py": "class W:\n    def __init__(self):\n        import streamdp\n"},
     ["never import the package root"]),
    # a module nobody placed
    ({"streamdp/__init__.py": "", "streamdp/newthing.py": ""}, ["streamdp.newthing: no layer"]),
])
def test_the_checker_catches_each_kind_of_break(tmp_path, files, expected):
    found = "\n".join(violations(_write(tmp_path, files)))
    for text in expected:
        assert text in found, found


def test_the_checker_accepts_a_downward_function_level_import(tmp_path):
    src = _write(tmp_path, {"streamdp/__init__.py": "", "streamdp/release.py":
                            "def f():\n    from streamdp.privacy.plan import BudgetSplit\n",
                            "streamdp/privacy/__init__.py": "", "streamdp/privacy/plan.py": ""})
    assert violations(src) == []


def measures(src: Path = ROOT) -> dict:
    mods = modules(src)
    edges = imports(mods)
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in mods.items()}
    return {"modules": len(mods),
            "largest_import_cycle": len(largest_cycle(mods, edges)),
            "function_level_imports": sum(e.in_function for e in edges),
            "files_over_600_lines": sorted(((n, m) for m, n in lines.items() if n > 600),
                                           reverse=True)}


def test_the_measure_finds_a_cycle_through_a_function_level_import(tmp_path):
    src = _write(tmp_path, {"streamdp/__init__.py": "", "streamdp/a.py": "import streamdp.b\n",
                            "streamdp/b.py": "def f():\n    import streamdp.c\n",
                            "streamdp/c.py": "from streamdp import a\n"})
    m = measures(src)
    assert m["largest_import_cycle"] == 3 and m["function_level_imports"] == 1


if __name__ == "__main__":
    for key, value in measures().items():
        print(f"{key}: {value}")
