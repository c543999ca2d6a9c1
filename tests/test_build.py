"""build_info, threads, instruction-set variants and the info command."""

import json
import os
import platform
import subprocess
import sys
import warnings

import numpy as np
import pytest

import posenc_fast as pf


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=120)


def test_build_info_reports_the_build():
    info = pf.build_info()
    assert info["version"] == pf.__version__
    assert info["compiler"]
    assert "baseline" in info["isa_built"] and "baseline" in info["isa_supported"]
    assert info["isa_in_use"] in info["isa_built"] and info["isa_in_use"] in info["isa_supported"]
    assert info["simd"] in ("scalar", "sse2", "avx", "avx2", "avx512", "avx512bf16", "neon")
    assert isinstance(info["thread_pool"], bool)
    assert info["num_threads"] == pf.get_num_threads()


def test_set_num_threads():
    previous = pf.get_num_threads()
    try:
        pf.set_num_threads(3)
        assert pf.get_num_threads() == 3 and pf.build_info()["num_threads"] == 3
        with pytest.raises(ValueError, match="n must be >= 1"):
            pf.set_num_threads(0)
        with pytest.raises(TypeError, match="n must be an integer"):
            pf.set_num_threads(2.0)
        with pytest.raises(TypeError, match="n must be an integer"):
            pf.set_num_threads(True)
        assert pf.get_num_threads() == 3
    finally:
        pf.set_num_threads(previous)


@pytest.mark.parametrize("flag", [True, np.True_, np.False_])
def test_set_num_threads_refuses_every_bool(flag):
    # NumPy 1.x lets np.bool_ through operator.index with a DeprecationWarning.
    previous = pf.get_num_threads()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(TypeError, match="n must be an integer, got bool"):
                pf.set_num_threads(flag)
        assert pf.get_num_threads() == previous
    finally:
        pf.set_num_threads(previous)


def test_thread_count_from_environment():
    code = "import posenc_fast as pf; print(pf.get_num_threads())"
    assert run_python(code, POSENC_FAST_NUM_THREADS="5").stdout.strip() == "5"
    bad = run_python(code, POSENC_FAST_NUM_THREADS="zero")
    assert bad.returncode == 0 and "not a positive integer" in bad.stderr


def test_every_built_variant_gives_bitwise_equal_results():
    code = ("import ml_dtypes, numpy as np, posenc_fast as pf, sys\n"
            "x = np.random.default_rng(0).standard_normal((3, 50, 64)).astype(np.float32)\n"
            "r = pf.RotaryEmbedding(64, layout='half').apply(x, offset=10**6)\n"
            "t = pf.sinusoidal_table(300, 37, offset=12345)\n"
            "i = pf.RotaryEmbedding(64).apply(x, np.arange(50) * 7)\n"
            "c, s = pf.RotaryEmbedding(64).cos_sin(np.arange(50))\n"
            "m = [pf.apply_rotary_cos_sin(x.astype(np.float64), c, s, layout=layout,\n"
            "                             inverse=inverse).tobytes()\n"
            "     for layout in ('interleaved', 'half') for inverse in (False, True)]\n"
            "a = pf.add_alibi(x[:, :, :50].copy(), offset=3, causal=False)\n"
            "n = [pf.RotaryEmbedding(d).apply_qk_norm(q, q, np.linspace(-2, 2, d), np.ones(d))[0].tobytes()\n"
            "     for d in (2, 6, 30, 32, 34, 62, 64, 100, 128, 256) for q in\n"  # below, at and past the 32
            "     (np.random.default_rng(d).standard_normal((1, 3, 5, d)).astype(t)\n"  # sums; norm_rows' dims
            "      for t in ('f4', 'f8', 'f2', ml_dtypes.bfloat16))]\n"
            "sys.stdout.buffer.write(r.tobytes() + t.tobytes() + i.tobytes() + b''.join(m)\n"
            "                        + a.tobytes() + b''.join(n))\n"
            "print(pf.build_info()['isa_in_use'], file=sys.stderr)\n")
    outputs = {}
    info = pf.build_info()
    for variant in info["isa_built"]:
        if variant not in info["isa_supported"]:
            continue
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                                env={**os.environ, "POSENC_FAST_ISA": variant})
        assert result.returncode == 0, result.stderr
        assert result.stderr.decode().strip().endswith(variant)
        outputs[variant] = result.stdout
    assert len(set(outputs.values())) == 1, f"variants differ: {list(outputs)}"


def test_unknown_isa_request_falls_back_with_a_warning():
    result = run_python("import posenc_fast as pf; print(pf.build_info()['isa_in_use'])",
                        POSENC_FAST_ISA="sve9")
    assert result.returncode == 0
    assert "POSENC_FAST_ISA='sve9' is not available" in result.stderr


ZEN5, ZEN4, SKYLAKE_SP = ("AuthenticAMD", 0x1A, 0x02), ("AuthenticAMD", 0x19, 0x11), (
    "GenuineIntel", 6, 0x55)
ALL = ["baseline", "avx2", "avx512"]


@pytest.mark.parametrize("cpu, expected, measured", [
    (ZEN5, "avx512", True), (ZEN4, "avx512", True), (SKYLAKE_SP, "avx2", True),
    (("GenuineIntel", 6, 0xCF), "avx512", True), (("GenuineIntel", 6, 0xA7), "avx512", True),
    (("GenuineIntel", 6, 0x8F), "avx512", False), (("", 0, 0), "avx2", False)])
def test_avx512_is_chosen_where_measurements_favour_it(cpu, expected, measured):
    # A CPU in no row of the table takes what the rows of its vendor favour, and says so.
    from posenc_fast import _dispatch

    variant, reason = _dispatch.choose(ALL, ALL, "", cpu)
    assert variant == expected
    assert reason.startswith(f"{expected}: ") and "avx512" in reason
    assert ("not measured" not in reason) == measured
    assert _dispatch.prefer_avx512(*cpu)[0] == (expected == "avx512")


@pytest.mark.parametrize("cpu, expected, words", [
    (ZEN4, (4 << 20, 8 << 10, 768, 2048, None, None, None, None), "AMD Zen 4, measured"),
    (("AuthenticAMD", 0x19, 0x61), (4 << 20, 8 << 10, 768, 2048, None, None, None, None), "not measured on this model"),
    (("AuthenticAMD", 0x19, 0x01), (None,) * 8, "the build's"),
    (ZEN5, (None,) * 8, "the build's"), (("GenuineIntel", 6, 0xCF), (None,) * 8, "the build's"),
    (("GenuineIntel", 6, 0xA7), (None, None, None, None, 4096, 256 << 10, 48 << 20, 2 << 20),
     "Intel family 6 model 0xa7, measured")])
def test_block_sizes_are_chosen_by_cpu(cpu, expected, words):
    from posenc_fast import _core, _cpu, _dispatch

    sizes = _dispatch.block_bytes(*cpu)
    kinds = ("position", "row", "group", "group_interleaved", "scalar_in_place", "add", "stream", "lines")
    assert tuple(sizes[kind][0] for kind in kinds) == expected
    assert all(words in why for kind, (_, why) in sizes.items() if kind != "lines")
    assert ("not measured" in sizes["lines"][1]) == (cpu != ("GenuineIntel", 6, 0xA7))
    if cpu == _cpu.cpu_identity():  # this CPU's row is what the walks use
        info, used = pf.build_info(), _core.block_bytes()
        assert (info["position_block_bytes"], info["row_block_bytes"], info["group_row_bytes"],
                info["group_interleaved_row_bytes"], info["scalar_in_place_row_bytes"],
                info["add_block_bytes"], info["stream_bytes"], info["line_rows_bytes"]) == tuple(
                    used[kind][0] for kind in kinds)
        build = {"position": 512 << 10, "row": 16 << 10, "group": 0, "group_interleaved": 0,
                 "scalar_in_place": 512, "add": 0, "stream": 16 << 20, "lines": 0}
        assert tuple(used[kind][0] for kind in kinds) == tuple(
            build[kind] if size is None else size for kind, size in zip(kinds, expected))


@pytest.mark.parametrize("built, supported, expected, why", [
    (ALL, ["baseline", "avx2"], "avx2", "avx512 not supported by the CPU (or its OS)"),
    (["baseline", "avx2"], ALL, "avx2", "avx512 not built"),
    (["baseline", "avx512"], ALL, "avx512", "avx512: supported; avx2 not built"),
    (ALL, ["baseline"], "baseline", "avx512 not supported by the CPU (or its OS); avx2 not "
                                    "supported"),
    (["baseline"], ALL, "baseline", "avx512 not built; avx2 not built"),
])
def test_choice_without_a_wider_variant_says_what_is_missing(built, supported, expected, why):
    from posenc_fast import _dispatch

    variant, reason = _dispatch.choose(built, supported, "", ZEN4)
    assert variant == expected and why in reason


@pytest.mark.parametrize("cpu, supported, expected", [
    (ZEN4, ALL + ["avx512bf16"], "avx512bf16"), (ZEN4, ALL, "avx512"), (SKYLAKE_SP, ALL + ["avx512bf16"], "avx2"),
    (("GenuineIntel", 6, 0x8F), ALL + ["avx512bf16"], "avx512bf16")])
def test_avx512bf16_is_the_avx512_choice_where_the_cpu_has_it(cpu, supported, expected):
    from posenc_fast import _dispatch

    built = ALL + ["avx512bf16"]
    variant, reason = _dispatch.choose(built, supported, "", cpu)
    assert variant == expected and reason.startswith(f"{expected}: ")
    assert _dispatch.choose(built, supported, "avx512", cpu)[0] == "avx512"
    assert _dispatch.choose(["baseline", "avx512bf16"], supported, "", cpu)[0] == (
        "avx512bf16" if "avx512bf16" in supported else "baseline")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or platform.machine() != "x86_64",
                    reason="reads the CPU flags of Linux's /proc/cpuinfo on x86-64")
def test_the_variants_the_cpu_supports_are_those_linux_lists():
    from posenc_fast import _cpu

    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    supports = _cpu.cpu_supports()
    assert ("avx2" in supports) == ({"avx2", "f16c"} <= flags)
    assert ("avx512" in supports) == ({"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags)
    assert ("avx512bf16" in supports) == ("avx512" in supports and "avx512_bf16" in flags)


def test_requested_variant_is_forced_only_where_usable():
    from posenc_fast import _dispatch

    assert _dispatch.choose(ALL, ALL, " AVX2 ", ZEN5) == ("avx2", "forced by POSENC_FAST_ISA=avx2")
    assert _dispatch.choose(ALL, ALL, "avx512", ZEN4)[0] == "avx512"
    with pytest.warns(RuntimeWarning, match="POSENC_FAST_ISA='avx512' is not available"):
        assert _dispatch.choose(ALL, ["baseline", "avx2"], "avx512", ZEN5)[0] == "avx2"


def test_build_info_says_why_its_variant_runs():
    info = pf.build_info()
    assert info["isa_reason"].startswith(info["isa_in_use"] + ": ")
    forced = [name for name in info["isa_built"] if name in info["isa_supported"]][0]
    result = run_python("import json, posenc_fast as pf; print(json.dumps(pf.build_info()))",
                        POSENC_FAST_ISA=forced)
    assert json.loads(result.stdout)["isa_reason"] == f"forced by POSENC_FAST_ISA={forced}"


def test_info_command():
    result = subprocess.run([sys.executable, "-m", "posenc_fast", "info"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0
    for key in ("version", "compiler", "isa_in_use", "isa_reason", "thread_pool", "num_threads"):
        assert key in result.stdout
    as_json = subprocess.run([sys.executable, "-m", "posenc_fast", "info", "--json"],
                             capture_output=True, text=True, timeout=120)
    assert json.loads(as_json.stdout)["version"] == pf.__version__


def test_gil_is_released_threads_agree():
    from concurrent.futures import ThreadPoolExecutor

    rope = pf.RotaryEmbedding(128, layout="half")
    x = np.random.default_rng(1).standard_normal((8, 256, 128)).astype(np.float32)
    want = rope.apply(x)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: rope.apply(x), range(16)))
    for result in results:
        np.testing.assert_array_equal(result, want)
