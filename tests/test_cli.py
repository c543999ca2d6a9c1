"""The command line: ``python -m posenc_fast info | check | plot`` in a subprocess."""

import importlib.util
import re
import subprocess
import sys

import pytest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "posenc_fast", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_info_prints_the_build_facts():
    result = _run("info")
    assert result.returncode == 0, result.stderr
    for key in ("version", "compiler", "isa_in_use", "thread_pool", "num_threads"):
        assert re.search(rf"^{key}\s", result.stdout, re.MULTILINE), result.stdout


def test_check_passes_and_ends_with_the_count_line():
    result = _run("check", "--cases", "100")
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "100 passed, 0 failed", result.stdout + result.stderr
    assert result.returncode == 0


@pytest.mark.parametrize("args, message", [(("--cases", "0"), "--cases must be >= 1"),
                                           (("--seed", "-1"), "--seed must be >= 0")])
def test_check_refuses_bad_options_without_a_traceback(args, message):
    result = _run("check", *args)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"check: {message}" in result.stderr


def test_plot_writes_png_files(tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    out = tmp_path / "figures"
    result = _run("plot", "--out", str(out))
    assert result.returncode == 0, result.stderr
    written = [line for line in result.stdout.splitlines() if line.endswith(".png")]
    assert len(written) >= 4, result.stdout
    for line in written:
        path = out / line.rsplit("/", 1)[-1]
        assert str(path) == line
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, path


def test_plot_without_matplotlib_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; "
            "from posenc_fast.__main__ import main; "
            f"sys.exit(main(['plot', '--out', {str(tmp_path)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "pip install 'posenc-fast[plot]'" in result.stderr
    assert not list(tmp_path.iterdir())


def test_check_reports_a_wrong_result(monkeypatch, capsys):
    import argparse

    import numpy as np

    import posenc_fast as pf
    from posenc_fast import _cli_check

    right = pf.sinusoidal
    monkeypatch.setattr(pf, "sinusoidal", lambda *a, **k: right(*a, **k) * np.float32(1.001))
    status = _cli_check.run(argparse.Namespace(cases=60, seed=1))
    lines = capsys.readouterr().out.strip().splitlines()
    assert status == 1
    assert re.fullmatch(r"\d+ passed, [1-9]\d* failed", lines[-1])
    assert any(line.startswith("FAIL") and "sinusoidal(" in line for line in lines)
