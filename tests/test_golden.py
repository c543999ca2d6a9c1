"""Every kernel reproduces tests/golden/golden.json bit for bit.

The record was taken before the kernels were restructured (baseline
variant); every ISA variant the CPU supports and several thread counts must
reproduce it.  After an intended change of results, record it anew with
``python tests/golden/golden.py record`` and say why in the commit.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import posenc_fast as pf

GOLDEN = Path(__file__).parent / "golden" / "golden.py"
INFO = pf.build_info()
VARIANTS = [name for name in INFO["isa_built"] if name in INFO["isa_supported"]]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("variant", VARIANTS)
def test_results_equal_the_golden_record(variant, threads):
    env = dict(os.environ, POSENC_FAST_ISA=variant, POSENC_FAST_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, str(GOLDEN), "check"], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"({variant}, {threads} threads)" in result.stdout
