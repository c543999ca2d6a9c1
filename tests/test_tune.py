"""``python -m posenc_fast tune`` and its file: a CPU in, a variant out (pure functions), then the import."""

import json
import os
import subprocess
import sys

import pytest

from posenc_fast import _cpu, _dispatch

ALL = ["baseline", "avx2", "avx512"]
ZEN5, INTEL = ("AuthenticAMD", 0x1A, 0x02), ("GenuineIntel", 6, 0xCF)


def test_the_file_holds_a_choice_per_cpu():
    text = _dispatch.with_tuned_variant(None, ZEN5, "avx2", {"W1": 1.05})
    text = _dispatch.with_tuned_variant(text, INTEL, "avx512", {"W1": 0.9})
    assert _dispatch.tuned_variant(text, ZEN5) == "avx2"
    assert _dispatch.tuned_variant(text, INTEL) == "avx512"
    assert _dispatch.tuned_variant(text, ("GenuineIntel", 6, 0x8F)) is None  # another CPU model
    assert _dispatch.tuned_variant(None, ZEN5) is None
    assert json.loads(text)["cpus"]["AuthenticAMD family 0x1a model 0x2"]["ratios"] == {"W1": 1.05}
    again = _dispatch.with_tuned_variant(text, ZEN5, "avx512", {})
    assert _dispatch.tuned_variant(again, ZEN5) == "avx512"
    assert _dispatch.tuned_variant(again, INTEL) == "avx512"


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"cpus": {"AuthenticAMD family 0x1a '
                                  'model 0x2": {"variant": "sse9"}}}'])
def test_a_file_tune_did_not_write_is_refused(text):
    with pytest.raises(ValueError, match="tuning file|names no variant"):
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


def _python(code, tune_file):
    env = {k: v for k, v in os.environ.items() if k != "POSENC_FAST_ISA"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**env, "POSENC_FAST_TUNE_FILE": str(tune_file)})


INFO = "import posenc_fast as pf; i = pf.build_info(); print(i['isa_in_use']); print(i['isa_reason'])"


def test_the_import_reads_the_file_for_this_cpu(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(_dispatch.with_tuned_variant(None, _cpu.cpu_identity(), "baseline", {}))
    result = _python(INFO, path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        "baseline", "baseline: measured fastest on this CPU by python -m posenc_fast tune"]
    path.write_text("{broken")
    result = _python(INFO, path)
    assert result.returncode == 0 and "ignored: not a posenc_fast tuning file" in result.stderr
    assert result.stdout.split("\n")[0] == _dispatch.choose(
        _dispatch.BUILT, _dispatch.CPU_SUPPORTS, "", _cpu.cpu_identity())[0]


def test_tune_measures_and_writes_this_cpus_entry(tmp_path):
    path = tmp_path / "tune.json"
    result = _python("from posenc_fast.__main__ import main; raise SystemExit(main(['tune', "
                     "'--rounds', '3']))", path)
    assert result.returncode == 0, result.stderr
    usable = [n for n in _dispatch.PREFERENCE if n in _dispatch.BUILT and n in _dispatch.CPU_SUPPORTS]
    wide = [n for n in usable if n in _dispatch.AVX512]
    if not wide or "avx2" not in usable:
        assert "nothing to choose" in result.stdout and not path.exists()
        return
    variant = _dispatch.tuned_variant(path.read_text(), _cpu.cpu_identity())
    assert variant in ("avx2", wide[0]) and f": {variant}\n" in result.stdout  # the widest AVX-512 against AVX2
    assert _python(INFO, path).stdout.split("\n")[0] == variant
