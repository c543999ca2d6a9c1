"""Apply each deliberate bug of mutants.py to a copy of the tree, run the tests that should notice.

    python3 tests/mutants/run.py [--only SUBSTRING ...] [--keep DIR]

For each mutant, one at a time: the copy's file gets the bug, compiled
sources are rebuilt (only the variant the mutant names, ``POSENC_FAST_ISA``
set to it), its tests run (``pytest -x -q``, the README's interpreter), and
the line printed says ``killed`` (a test failed), ``SURVIVED`` (every test
passed: a missing test) or ``broken`` (the mutant did not apply or build).
Exit status 1 when any mutant survived or broke.  Takes minutes: each
compiled mutant is a build.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMPILED = (".pyx", ".pxi", ".pxd", ".h", ".tp")


def _copy_tree(dest: Path) -> None:
    for name in ("src", "tests", "bench", "setup.py", "pyproject.toml", "README.md"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns(
                "__pycache__", ".hypothesis", "build"))
        else:
            shutil.copy2(source, dest / name)


def _build(tree: Path, isa: str) -> subprocess.CompletedProcess:
    for stale in (tree / "src" / "posenc_fast").glob("_isa_*.so"):
        stale.unlink()  # a variant left from another build would run unmutated kernels
    env = dict(os.environ, POSENC_FAST_ISA_VARIANTS=isa)
    return subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", "2"],
                          cwd=tree, env=env, capture_output=True, text=True)


def _tests(tree: Path, tests, isa: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), POSENC_FAST_ISA=isa)
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=tree, env=env, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=(), help="mutants whose name contains one")
    parser.add_argument("--keep", metavar="DIR", help="build the copy here and keep it")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or any(s in m.name for s in args.only)]
    # Python mutants first (one build for all), then the compiled ones, each a build.
    chosen.sort(key=lambda m: m.path.endswith(COMPILED))
    tree = Path(args.keep or tempfile.mkdtemp(prefix="posenc_mutants_"))
    if tree.exists() and args.keep:
        shutil.rmtree(tree)
    _copy_tree(tree)
    results = []
    built_for = None
    for mutant in chosen:
        start = time.perf_counter()
        path = tree / mutant.path
        original = path.read_text()
        if original.count(mutant.old) != 1:
            status, why = "broken", f"the text to replace occurs {original.count(mutant.old)} times"
        else:
            path.write_text(original.replace(mutant.old, mutant.new))
            compiled = mutant.path.endswith(COMPILED)
            build = None
            if compiled or built_for != "clean":
                build = _build(tree, "baseline,avx2,avx512,avx512bf16" if not compiled else
                               ",".join(dict.fromkeys(("baseline", mutant.isa))))
                built_for = "mutant" if compiled else "clean"
            if build is not None and build.returncode != 0:
                status, why = "broken", build.stderr.strip().splitlines()[-1:]
            else:
                result = _tests(tree, mutant.tests, mutant.isa if compiled else "")
                failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
                # pytest's 4 and 5: a usage error, no test selected (a -k that matches nothing)
                status = ("broken" if result.returncode in (4, 5) else
                          "killed" if result.returncode != 0 else "SURVIVED")
                why = failed[0][7:] if failed else result.stdout.strip().splitlines()[-1:]
            path.write_text(original)
            if compiled:
                built_for = None  # the next mutant (or the clean tree) needs a build
        results.append(status)
        print(f"{status:9s} {mutant.layer:22s} {mutant.name}  ({time.perf_counter() - start:.0f} s)"
              f"\n          by: {why}", flush=True)
    print(f"{results.count('killed')} killed, {results.count('SURVIVED')} survived, "
          f"{results.count('broken')} broken, of {len(results)}")
    if not args.keep:
        shutil.rmtree(tree, ignore_errors=True)
    return 0 if results.count("killed") == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
