"""``python -m posenc_fast bench --quick --json``: it runs, its JSON covers every workload,
its times are positive and every result it times matches the float64 reference;
``--save`` writes the ratios and ``--compare`` gates on them (a doctored file forces
the failure: these test the gate, never the timing).

One subprocess run (about 10-20 s on 2 cores) is shared by the tests below; the
compare test runs a second.
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


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "posenc_fast", "bench", "--quick", *args],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def saved_path(tmp_path_factory):
    return tmp_path_factory.mktemp("bench") / "ratios.json"


@pytest.fixture(scope="module")
def report(saved_path):
    proc = _bench("--json", "--save", str(saved_path))
    assert proc.returncode == 0, f"bench failed:\n{proc.stderr[-3000:]}"
    assert "[1/" in proc.stderr  # the progress line goes to stderr, never into the JSON
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def saved(report, saved_path):
    with open(saved_path) as fh:
        return json.load(fh)


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


def test_save_writes_every_workloads_ratio(report, saved):
    assert saved["format"] == _cli_bench.RATIOS_FORMAT
    assert saved["machine"] == report["machine"] and saved["build_info"] == report["posenc_fast"]
    assert (saved["dtype"], saved["threads"]) == (report["dtype"], report["threads"])
    assert [row["key"] for row in saved["rows"]] == list(CLI_WORKLOADS)
    measured = {w["key"]: r["ratio_to_limit"] for w in report["workloads"]
                for r in w["results"] if r["impl"] == "posenc_fast"}
    for row in saved["rows"]:
        assert row["ratio"] == measured[row["key"]] > 0


def test_compare_fails_when_a_ratio_grew(saved, tmp_path):
    doctored = dict(saved, rows=[dict(row, ratio=1e-9 if n == 1 else 1e9)
                                 for n, row in enumerate(saved["rows"])])
    path = tmp_path / "doctored.json"
    path.write_text(json.dumps(doctored))
    proc = _bench("--compare", str(path), "--fail-above", "1.10")
    assert proc.returncode == _cli_bench.EXIT_SLOWER, proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("Ratios to the limit against"):]
    statuses = [line.split()[-1] for line in table.splitlines()[2:]]
    assert statuses == ["ok", "SLOWER"] + ["ok"] * (len(CLI_WORKLOADS) - 2)
    assert saved["rows"][1]["title"] in proc.stderr


def test_compare_statuses(saved):
    rows = saved["rows"]
    entries = _cli_bench.compare_ratios(rows, rows, 1.10)
    assert [e["status"] for e in entries] == ["ok"] * len(rows)
    grown = [dict(rows[0], ratio=rows[0]["ratio"] * 1.2)] + rows[1:-1]
    entries = _cli_bench.compare_ratios(rows, grown, 1.10)
    assert [e["status"] for e in entries] == ["SLOWER"] + ["ok"] * (len(rows) - 2) + ["MISSING"]
    entries = _cli_bench.compare_ratios(rows[1:], rows, 1.10)
    assert entries[-1]["status"] == "new" and entries[-1]["key"] == rows[0]["key"]
    assert [e["status"] for e in _cli_bench.compare_ratios(grown, rows, 1.25)][0] == "ok"


def test_compare_refuses_a_file_it_cannot_use(saved, tmp_path):
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(saved))
    other = "float64" if saved["dtype"] == "float32" else "float32"
    with pytest.raises(ValueError, match="--dtype"):
        _cli_bench.load_ratios(str(path), other, saved["threads"])
    with pytest.raises(ValueError, match="--threads"):
        _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"] + 1)
    assert _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"]) == saved
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="bench --save"):
        _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"])
    path.write_text("{")
    with pytest.raises(ValueError, match="JSON"):
        _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"])


@pytest.mark.parametrize("change", [dict(rows=None), dict(rows=5), dict(rows=[{}]), dict(build_info=[]),
                                    "ratio", dict(ratio="x"), dict(ratio=True), dict(ratio=float("nan"))])
def test_compare_refuses_rows_it_cannot_read(saved, tmp_path, change):
    # a file with the right header but rows it cannot compare: refused before anything is measured
    # (it was a KeyError or TypeError after the whole run)
    if change == "ratio":
        broken = dict(saved, rows=[{k: v for k, v in row.items() if k != "ratio"} for row in saved["rows"]])
    elif "ratio" in change:
        broken = dict(saved, rows=[dict(saved["rows"][0], **change)] + saved["rows"][1:])
    else:
        broken = {k: v for k, v in dict(saved, **change).items() if v is not None}
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="rows a list of objects with key, title, dtype, shape, ratio"):
        _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"])


@pytest.mark.parametrize("where", ["a missing folder", "a folder"])
def test_save_where_it_cannot_write_is_a_usage_error(tmp_path, where):
    target = tmp_path / "absent" / "x.json" if where == "a missing folder" else tmp_path
    proc = _bench("--save", str(target))
    assert proc.returncode == _cli_bench.EXIT_USAGE
    assert "--save" in proc.stderr and "[1/" not in proc.stderr  # nothing measured


def test_bad_compare_file_is_a_usage_error(tmp_path):
    proc = _bench("--compare", str(tmp_path / "absent.json"))
    assert proc.returncode == _cli_bench.EXIT_USAGE
    assert "--compare" in proc.stderr and "[1/" not in proc.stderr  # nothing measured


def test_compare_refuses_a_file_of_another_cpu(saved, tmp_path):
    # Ratios to the limit differ by CPU and variant: a file of another machine is refused
    # (by bench itself too, before it measures), unless --any-cpu says to compare anyway.
    here = {key: saved["build_info"][key] for key in ("cpu", "isa_in_use")}
    path = tmp_path / "other_cpu.json"
    path.write_text(json.dumps(dict(saved, build_info=dict(saved["build_info"],
                                                           cpu="AuthenticAMD family 0x1a model 0x2"))))
    with pytest.raises(ValueError, match="saved with cpu 'AuthenticAMD family 0x1a model 0x2'.*--any-cpu"):
        _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"], here)
    assert _cli_bench.load_ratios(str(path), saved["dtype"], saved["threads"])["rows"]
    proc = _bench("--compare", str(path))
    assert proc.returncode == _cli_bench.EXIT_USAGE and "--any-cpu" in proc.stderr
    assert "[1/" not in proc.stderr
    same = tmp_path / "same.json"
    same.write_text(json.dumps(saved))
    assert _cli_bench.load_ratios(str(same), saved["dtype"], saved["threads"], here) == saved
