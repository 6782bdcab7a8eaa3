"""docs/threat_model.md names, for each actor who could break the privacy promise, the code that
stops them and the attack test in which they try. A renamed or deleted test or module must not
leave the page pointing at nothing: every reference must resolve."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "threat_model.md"

TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
PATH_REF = re.compile(r"`((?:streamdp|k8s|services)/[\w/.]*?)`")


def _test_functions(path: Path) -> set[str]:
    """Names of the module-level test functions and test methods of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            names.add(node.name)
    return names


def _refs():
    text = PAGE.read_text(encoding="utf-8")
    return text, TEST_REF.findall(text), PATH_REF.findall(text)


def test_the_page_names_attack_tests_for_every_table_row():
    text, tests, _ = _refs()
    assert len(tests) >= 30, "the threat model lost its attack tests"
    rows = [line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| actor") and not line.startswith("| what")
            and not set(line) <= set("|- ")]
    assert rows
    for row in rows:
        assert TEST_REF.search(row), f"a threat-model row names no attack test: {row[:100]}"


@pytest.mark.parametrize("path,name", sorted(set(_refs()[1])))
def test_every_named_attack_test_exists(path, name):
    f = ROOT / path
    assert f.is_file(), f"docs/threat_model.md names {path}, which does not exist"
    assert name in _test_functions(f), f"docs/threat_model.md names {path}::{name}, which does not exist"


@pytest.mark.parametrize("path", sorted(set(_refs()[2])))
def test_every_named_defence_exists(path):
    assert (ROOT / path).exists(), f"docs/threat_model.md names {path}, which does not exist"
