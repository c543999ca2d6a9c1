"""The README's test command is the one CI runs."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not (ROOT / ".ci" / "run").is_file(), reason="needs the source tree")
def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    # the line that installs and runs pytest (the other steps install apart from their tests)
    [command] = [line for line in ci.splitlines() if "pip install" in line and "-m pytest" in line]
    assert command.strip() in [line.strip() for line in readme.splitlines()]
