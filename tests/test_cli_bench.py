"""``python -m posenc_fast bench --quick --json``: it runs, its JSON covers every workload,
its times are positive and every result it times matches the float64 reference.

One subprocess run (about 10-20 s on 2 cores) is shared by the tests below.
"""

import json
import os
import subprocess
import sys

import pytest

from posenc_fast import _cli_bench
from posenc_fast._bench.cases import CLI_WORKLOADS

# max |result - reference| / max(1, max |reference|) for float32 results.
FLOAT32_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run([sys.executable, "-m", "posenc_fast", "bench", "--quick", "--json"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, f"bench failed:\n{proc.stderr[-3000:]}"
    assert "[1/" in proc.stderr  # the progress line goes to stderr, never into the JSON
    return json.loads(proc.stdout)


def test_header(report):
    assert report["quick"] is True
    assert report["dtype"] == "float32"
    assert report["posenc_fast"]["version"]
    assert report["threads"] >= 1
    assert report["rounds"] >= 1


def test_every_workload_is_timed(report):
    assert [w["key"] for w in report["workloads"]] == list(CLI_WORKLOADS)
    for workload in report["workloads"]:
        impls = {r["impl"] for r in workload["results"]}
        assert {"posenc_fast", "limit", "numpy"} <= impls, workload["key"]
        assert workload["bytes_moved"] > 0
        if report["torch"] is None:
            assert "torch" not in impls


def test_times_are_positive(report):
    for workload in report["workloads"]:
        for result in workload["results"]:
            assert result["median_ns"] > 0, (workload["key"], result["impl"])
            assert result["gb_per_s"] > 0
            assert result["samples"] >= 3
            assert result["speedup_vs_numpy"] > 0


def test_results_match_the_reference(report):
    for workload in report["workloads"]:
        for result in workload["results"]:
            if result["impl"] == "limit":
                assert result["max_abs_diff"] is None
                continue
            assert result["max_rel_diff"] is not None, (workload["key"], result["impl"])
            assert 0 <= result["max_rel_diff"] <= FLOAT32_TOLERANCE, (workload["key"], result)
            assert result["ok"] is True


def test_table_names_every_workload(report, capsys):
    _cli_bench._print_table(report)
    text = capsys.readouterr().out
    for workload in report["workloads"]:
        assert workload["title"] in text
    assert "vs NumPy" in text and "max |diff|" in text


def test_help_says_what_quick_changes():
    proc = subprocess.run([sys.executable, "-m", "posenc_fast", "bench", "--help"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 0
    assert "--quick" in proc.stdout and "rounds" in proc.stdout
