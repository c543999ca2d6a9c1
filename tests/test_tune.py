"""``python -m posenc_fast tune`` and its file: a CPU in, a variant out (pure functions), then the import."""

import json
import os
import subprocess
import sys

import pytest

from posenc_fast import _cpu, _dispatch
from posenc_fast._cli_tune import BLOCK_CANDIDATES, pick

ALL = ["baseline", "avx2", "avx512"]
ZEN5, ZEN4, INTEL = ("AuthenticAMD", 0x1A, 0x02), ("AuthenticAMD", 0x19, 0x11), ("GenuineIntel", 6, 0xCF)


def test_the_file_holds_a_choice_per_cpu():
    text = _dispatch.with_tuned(None, ZEN5, {"variant": "avx2", "ratios": {"W1": 1.05}})
    text = _dispatch.with_tuned(text, INTEL, {"variant": "avx512", "ratios": {"W1": 0.9}})
    assert _dispatch.tuned_variant(text, ZEN5) == "avx2"
    assert _dispatch.tuned_variant(text, INTEL) == "avx512"
    assert _dispatch.tuned_variant(text, ("GenuineIntel", 6, 0x8F)) is None  # another CPU model
    assert _dispatch.tuned_variant(None, ZEN5) is None
    assert json.loads(text)["cpus"]["AuthenticAMD family 0x1a model 0x2"]["ratios"] == {"W1": 1.05}
    again = _dispatch.with_tuned(text, ZEN5, {"variant": "avx512", "ratios": {}})
    assert _dispatch.tuned_variant(again, ZEN5) == "avx512"
    assert _dispatch.tuned_variant(again, INTEL) == "avx512"


def test_the_file_holds_block_sizes_per_cpu():
    text = _dispatch.with_tuned(None, ZEN5, {"blocks": {"position": 1 << 20, "group": 0}})
    text = _dispatch.with_tuned(text, INTEL, {"variant": "avx512", "ratios": {}})
    assert _dispatch.tuned_blocks(text, ZEN5) == {"position": 1 << 20, "group": 0}
    assert _dispatch.tuned_variant(text, ZEN5) is None  # sizes without a variant (no AVX-512 there)
    assert _dispatch.tuned_blocks(text, INTEL) is None and _dispatch.tuned_blocks(None, ZEN5) is None


@pytest.mark.parametrize("blocks", [[1 << 20], {"position": 0}, {"row": 1.5}, {"group": -1}, {"row": True},
                                    {"heads": 4}, {"row": 10**22}])
def test_block_sizes_tune_did_not_write_are_refused(blocks):
    text = json.dumps({"version": 1, "cpus": {_dispatch.cpu_key(ZEN5): {"blocks": blocks}}})
    with pytest.raises(ValueError, match="blocks that are not sizes in bytes"):
        _dispatch.tuned_blocks(text, ZEN5)


def test_tuned_block_sizes_win_over_the_table_and_yield_to_the_build():
    built = {"position": (512 << 10, False), "row": (16 << 10, True), "group": (0, False),
             "group_interleaved": (0, False), "scalar_in_place": (512, False), "add": (0, False),
             "stream": (16 << 20, False), "lines": (0, False)}
    sizes = _dispatch.block_sizes(ZEN4, built, {"position": 1 << 20, "row": 4096})
    assert sizes["position"] == (1 << 20, "1048576 bytes: measured on this CPU by python -m posenc_fast tune")
    assert sizes["row"] == (16 << 10, "set by the build (-DPOSENC_ROW_BLOCK_BYTES)")
    assert sizes["group"][0] == 768 and "AMD Zen 4" in sizes["group"][1]  # the table's
    assert sizes["group_interleaved"][0] == 2048 and "AMD Zen 4" in sizes["group_interleaved"][1]
    untuned = _dispatch.block_sizes(ZEN4, built)
    assert untuned["position"][0] == 4 << 20 and "AMD Zen 4" in untuned["position"][1]
    assert _dispatch.block_sizes(ZEN5, built)["position"] == (512 << 10, _dispatch.block_bytes(*ZEN5)["position"][1])
    intel = _dispatch.block_sizes(("GenuineIntel", 6, 0xA7), built, {"scalar_in_place": 0})
    assert intel["scalar_in_place"][0] == 0 and "tune" in intel["scalar_in_place"][1]
    assert _dispatch.block_sizes(("GenuineIntel", 6, 0xA7), built)["scalar_in_place"][0] == 4096
    assert _dispatch.block_sizes(("GenuineIntel", 6, 0xA7), built, {"stream": 1 << 20})["stream"][0] == 1 << 20


def test_a_block_size_changes_only_beyond_the_margin():
    assert pick(4096, {8192: 0.96}) == 8192
    assert pick(4096, {8192: 0.98}) == 4096  # within MARGIN (0.97): noise of a few rounds
    assert pick(4096, {8192: 0.9, 16384: 0.8}) == 16384
    assert pick(4096, {8192: 1.2}) == 4096 and pick(4096, {}) == 4096


@pytest.mark.parametrize("text", ["not json", "[1, 2]", "[" * 100000 + "]" * 100000,
                                  '{"version": 1, "cpus": {"AuthenticAMD family 0x1a model 0x2": {"variant": "sse9"}}}',
                                  '{"version": 2, "cpus": {"AuthenticAMD family 0x1a model 0x2": {"variant": "avx2"}}}',
                                  '{"cpus": {"AuthenticAMD family 0x1a model 0x2": {"variant": "avx2"}}}'],
                         ids=["not json", "a list", "nested past the recursion limit", "no such variant",
                              "a later version", "no version"])
def test_a_file_tune_did_not_write_is_refused(text):
    with pytest.raises(ValueError, match="tuning file|names no variant|this posenc_fast reads version 1"):
        _dispatch.tuned_variant(text, ZEN5)


def test_a_tuned_choice_wins_over_the_table_and_yields_to_the_environment():
    assert _dispatch.choose(ALL, ALL, "", ZEN5, "avx2") == (
        "avx2", "avx2: measured fastest on this CPU by python -m posenc_fast tune")
    assert _dispatch.choose(ALL, ALL, "avx512", ZEN5, "avx2")[0] == "avx512"
    assert _dispatch.choose(ALL, ALL, "", ZEN5, None)[0] == "avx512"
    with pytest.warns(RuntimeWarning, match="names 'avx512', which is not usable here"):
        assert _dispatch.choose(ALL, ["baseline", "avx2"], "", ZEN5, "avx512")[0] == "avx2"


def test_the_file_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_FAST_TUNE_FILE", str(tmp_path / "x.json"))
    assert _dispatch.tune_file() == tmp_path / "x.json"
    monkeypatch.delenv("POSENC_FAST_TUNE_FILE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _dispatch.tune_file() == tmp_path / "posenc_fast" / "tune.json"


def _python(code, tune_file, **environ):
    env = {k: v for k, v in os.environ.items() if k != "POSENC_FAST_ISA"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**env, "POSENC_FAST_TUNE_FILE": str(tune_file), **environ})


INFO = "import posenc_fast as pf; i = pf.build_info(); print(i['isa_in_use']); print(i['isa_reason'])"


BLOCKS = ("import posenc_fast as pf; i = pf.build_info(); "
          "print(i['row_block_bytes']); print(i['row_block_reason']); print(i['group_row_bytes'])")


def test_the_import_reads_the_file_for_this_cpu(tmp_path):
    from posenc_fast import _core

    path = tmp_path / "tune.json"
    path.write_text(_dispatch.with_tuned(None, _cpu.cpu_identity(), {
        "variant": "baseline", "ratios": {}, "blocks": {"row": 4096, "group": 0}}))
    result = _python(INFO, path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        "baseline", "baseline: measured fastest on this CPU by python -m posenc_fast tune"]
    if not _core.block_bytes()["row"][1]:  # a size the build was given stands
        result = _python(BLOCKS, path)
        assert result.stdout.split("\n")[:2] == [
            "4096", "4096 bytes: measured on this CPU by python -m posenc_fast tune"], result.stderr
    path.write_text("{broken")
    result = _python(INFO, path)
    assert result.returncode == 0 and "ignored: not a posenc_fast tuning file" in result.stderr
    assert result.stdout.split("\n")[0] == _dispatch.choose(
        _dispatch.BUILT, _dispatch.CPU_SUPPORTS, "", _cpu.cpu_identity())[0]
    assert _python(BLOCKS, path).stdout.split("\n")[0] == str(_core.block_bytes()["row"][0])  # the table's


@pytest.mark.parametrize("rounds", ["0", "-2"])
def test_tune_refuses_rounds_below_one(tmp_path, rounds):
    result = _python("from posenc_fast.__main__ import main; raise SystemExit(main(['tune', "
                     f"'--rounds', '{rounds}']))", tmp_path / "tune.json")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"tune: --rounds must be >= 1, got {rounds}" in result.stderr
    assert not (tmp_path / "tune.json").exists()


def test_tune_measures_and_writes_this_cpus_entry(tmp_path):
    from posenc_fast import _core

    path = tmp_path / "tune.json"
    result = _python("from posenc_fast.__main__ import main; raise SystemExit(main(['tune', "
                     "'--rounds', '3']))", path)
    assert result.returncode == 0, result.stderr
    usable = [n for n in _dispatch.PREFERENCE if n in _dispatch.BUILT and n in _dispatch.CPU_SUPPORTS]
    wide = [n for n in usable if n in _dispatch.AVX512]
    variant = _dispatch.tuned_variant(path.read_text(), _cpu.cpu_identity())
    if not wide or "avx2" not in usable:
        assert "no variant to choose" in result.stdout and variant is None
    else:
        assert variant in ("avx2", wide[0]) and f": {variant}\n" in result.stdout  # the widest AVX-512 against AVX2
        assert _python(INFO, path).stdout.split("\n")[0] == variant
    # each block size the build was not given: one of its candidates or the one the import chose
    blocks = _dispatch.tuned_blocks(path.read_text(), _cpu.cpu_identity())
    free = [kind for kind, (_, given) in _core.block_bytes().items() if not given]
    assert sorted(blocks) == sorted(free)
    for kind in free:
        assert blocks[kind] in BLOCK_CANDIDATES[kind] + (_core.block_bytes()[kind][0],)
        assert f"{kind} block: {blocks[kind]} bytes\n" in result.stdout
    if "row" in free:
        assert _python(BLOCKS, path).stdout.split("\n")[:2] == [
            str(blocks["row"]), f"{blocks['row']} bytes: measured on this CPU by python -m posenc_fast tune"]


def test_tune_restores_the_kernels_in_use_even_the_baseline(tmp_path):
    # it switches the kernel table between samples; the baseline's has no module to switch back to
    code = ("from posenc_fast import _core; from posenc_fast.__main__ import main; before = _core.kernels_in_use(); "
            "main(['tune', '--rounds', '1', '--dry-run']); import ctypes; get = ctypes.pythonapi.PyCapsule_GetPointer; "
            "get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]; "
            "print(get(before, b'posenc_fast.kernel_table') == get(_core.kernels_in_use(), b'posenc_fast.kernel_table'))")
    result = _python(code, tmp_path / "tune.json", POSENC_FAST_ISA="baseline")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("True") and not (tmp_path / "tune.json").exists()


@pytest.mark.parametrize("kind", ["not UTF-8", "a folder", "sizes past Py_ssize_t", "nested past the recursion limit",
                                  "a later version"])
def test_the_import_survives_any_tuning_file(tmp_path, kind):
    # ignored with a warning that names it, the choice as without it
    path = tmp_path / "tune.json"
    if kind == "not UTF-8":
        path.write_bytes(bytes(range(128, 256)))
    elif kind == "a folder":
        path.mkdir()
    elif kind == "nested past the recursion limit":
        path.write_text("[" * 200000 + "]" * 200000)
    elif kind == "a later version":
        path.write_text(json.dumps({"version": 2, "cpus": {_dispatch.cpu_key(_cpu.cpu_identity()):
                                                           {"variant": "baseline"}}}))
    else:
        path.write_text(json.dumps({"version": 1, "cpus": {_dispatch.cpu_key(_cpu.cpu_identity()):
                                                           {"blocks": {"row": 10**22}}}}))
    result = _python(INFO, path)
    assert result.returncode == 0, result.stderr
    assert f"{path} ignored" in result.stderr
    assert result.stdout.split("\n")[0] == _dispatch.choose(
        _dispatch.BUILT, _dispatch.CPU_SUPPORTS, "", _cpu.cpu_identity())[0]
