"""posenc_fast on an emulated older CPU: import works, the baseline runs, values agree.

Needs ``qemu-x86_64`` (Debian package ``qemu-user``) on an x86-64 host;
skipped elsewhere.  A variant must never be imported on a CPU without its
instructions: the AVX2 module's init already holds VEX instructions.  QEMU
7.2 does not emulate AVX-512, so the avx512 variant is only shown to stay
unloaded (an emulated Skylake-SP without it), not run.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

QEMU = shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(
    QEMU is None or platform.machine().lower() not in ("x86_64", "amd64"),
    reason="needs qemu-x86_64 (Debian package qemu-user) on x86-64")

# One call of each kernel family; prints the ISA in use and a hash per call.
SCRIPT = r"""
import hashlib, json, sys
import numpy as np
import posenc_fast as pf

def h(*arrays):
    d = hashlib.sha256()
    for a in arrays:
        d.update(np.ascontiguousarray(a).tobytes())
    return d.hexdigest()

rng = np.random.default_rng(0)
x32 = rng.standard_normal((2, 3, 40, 64)).astype(np.float32)
x64 = x32.astype(np.float64)
rope = pf.RotaryEmbedding(64, layout="half")
cos, sin = pf.RotaryEmbedding(64).cos_sin(np.arange(40), dtype=np.float32)
calls = {
    "rope.apply": h(rope.apply(x32, offset=1000), rope.apply(x64)),
    "rope.interleaved": h(pf.RotaryEmbedding(64, rotary_dim=48).apply(x32, offset=3)),
    "apply_rotary": h(pf.apply_rotary(x64, interpolation_factor=2.0)),
    "apply_rotary_cos_sin": h(pf.apply_rotary_cos_sin(x32, cos, sin)),
    "cos_sin": h(*rope.cos_sin(np.arange(0, 5000, 3), dtype=np.float64)),
    "sinusoidal_table": h(pf.sinusoidal_table(300, 65, dtype=np.float64)),
    "add_position_table": h(pf.add_position_table(x32[0], x64[0, 0, :, :])),
    "add_alibi": h(pf.add_alibi(x32[0], causal=False)),
    "t5_relative_bucket": h(pf.t5_relative_bucket(20, 30)),
}
loaded = sorted(name for name in sys.modules if name.startswith("posenc_fast._isa_"))
print(json.dumps({"isa": pf.build_info()["isa_in_use"], "calls": calls, "loaded": loaded}))
"""


def _run(*prefix):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("POSENC_FAST_ISA", None)
    result = subprocess.run([*prefix, sys.executable, "-c", SCRIPT], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def native():
    return _run()


def _numpy_runs_on(cpu):
    probe = subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-c", "import numpy"],
                           capture_output=True, timeout=600)
    return probe.returncode == 0


# Nehalem: SSE4.2, no AVX.  SandyBridge: AVX without AVX2 or F16C.  Skylake-Server:
# AVX2, its AVX-512 masked by QEMU's TCG.
@pytest.mark.parametrize("cpu, expected", [("Nehalem", "baseline"), ("SandyBridge", "baseline"),
                                           ("Haswell", "avx2"), ("Skylake-Server", "avx2")])
def test_emulated_cpu_imports_and_agrees(native, cpu, expected):
    import posenc_fast as pf

    if expected not in pf.build_info()["isa_built"]:
        pytest.skip(f"the {expected} variant was not built")
    if not _numpy_runs_on(cpu):  # NumPy 2.4's wheels need more than Nehalem
        pytest.skip(f"the installed NumPy itself does not run on an emulated {cpu}")
    emulated = _run(QEMU, "-cpu", cpu)
    assert emulated["isa"] == expected
    assert emulated["loaded"] == ([] if expected == "baseline" else [f"posenc_fast._isa_{expected}"])
    assert emulated["calls"] == native["calls"]
