"""What a mutant is (mutants.py gathers them): its fields, and the paths the lists name often.

Each mutant is (name, layer of docs/architecture.md, file under the
repository root, the text replaced (exactly once in that file), its
replacement, the tests that must notice).  A mutant of a compiled source
(``.pyx``/``.pxi``/``.h``/``.tp``) is built before its tests run; ``isa``
names the variant whose kernels it changes (the tests then run that one).
"""

from typing import NamedTuple


class Mutant(NamedTuple):
    name: str
    layer: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    isa: str = "baseline"


PKG = "src/posenc_fast/"
KERNELS = PKG + "csrc/posenc_kernels.h.tp"
VECTORS = PKG + "csrc/posenc_vectors.h.tp"
POSITION = PKG + "csrc/posenc_position.h.tp"
