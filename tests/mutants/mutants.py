"""Deliberate bugs, one a line: each must make the tests it names fail (run.py applies them).

Each mutant (mutant.py) is (name, layer of docs/architecture.md, file under
the repository root, the text replaced (exactly once in that file), its
replacement, the tests that must notice); those of the compiled sources are
in mutants_compiled.py, those of the Python modules in mutants_python.py.
"""

from mutant import Mutant
from mutants_compiled import COMPILED
from mutants_python import PYTHON

MUTANTS: list[Mutant] = [*COMPILED, *PYTHON]
