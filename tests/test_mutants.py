"""The mutant lists (gathered by tests/mutants/mutants.py) stay applicable: each text it replaces is in its file once.

The runner itself takes minutes (opt-in); this keeps the list from going stale
between its runs when the code it mutates is rewritten.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "mutants"))
import mutants  # noqa: E402


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_once(mutant):
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: {mutant.path} holds its text {text.count(mutant.old)} times"
    assert mutant.new != mutant.old
    for test in mutant.tests:
        if test.startswith("tests/"):
            assert (ROOT / test).exists(), test
