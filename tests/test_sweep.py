"""bench/sweep.py can set every tuning constant: each is defined under #ifndef."""

import sys
import sysconfig
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import sweep  # noqa: E402

TUNING_CONSTANTS = ["POSENC_ROW_CHUNK", "POSENC_STREAM_BYTES", "POSENC_PREFETCH_BYTES",
                    "POSENC_PREFETCH_DISTANCE", "POSENC_POSITION_BLOCK_BYTES",
                    "POSENC_ROW_BLOCK_BYTES", "POSENC_BLOCK_ROW_BYTES", "POSENC_SCALAR_IN_PLACE_ROW_BYTES", "POSENC_ELEMENTS_PER_ITEM", "POSENC_TRIG_CHUNK_ROWS",
                    "POSENC_TRIG_STREAM_ROWS", "POSENC_PREFETCH_LOCALITY"]


@pytest.mark.parametrize("name", TUNING_CONSTANTS)
def test_tuning_constant_is_overridable(name):
    sweep.check_overridable(name)


def test_a_constant_without_a_guard_is_refused():
    with pytest.raises(ValueError, match="POSENC_SIMD is not guarded"):
        sweep.check_overridable("POSENC_SIMD")  # a build fact, not a tuning constant


def test_values_with_spaces_are_refused():
    with pytest.raises(SystemExit):
        sweep.main(["POSENC_ROW_CHUNK", "1 + 1", "--only", "x"])


def test_a_sweep_build_keeps_the_flags_python_was_built_with():
    # setuptools takes CFLAGS from the environment in place of Python's own (-fwrapv, -DNDEBUG, ...):
    # a sweep's build must be the package's build but for the one -D
    python_flags = sysconfig.get_config_var("CFLAGS") or ""
    assert sweep.build_cflags("POSENC_ROW_CHUNK", 64, {}) == f"{python_flags} -DPOSENC_ROW_CHUNK=64".strip()
    assert sweep.build_cflags("POSENC_ROW_CHUNK", 64, {"CFLAGS": "-O1"}) == "-O1 -DPOSENC_ROW_CHUNK=64"


def test_every_value_builds_in_a_folder_of_one_name_length(tmp_path):
    # the folder is in PYTHONPATH: a longer name moves the measuring process's stack
    dirs = sweep.build_dirs(tmp_path, ["8", "16384", "(1<<20)"])
    assert len({len(str(path)) for path in dirs.values()}) == 1
    assert len(set(dirs.values())) == 3
