"""Shared pytest configuration: hypothesis profiles.

``HYPOTHESIS_PROFILE=thorough`` runs many more random examples than CI's
default profile.
"""

import os
import tempfile

from hypothesis import HealthCheck, settings

# The tests read the tables of measured CPUs, not the tuning file `python -m posenc_fast tune` may
# have left in this user's cache (a path that does not exist; tests of the file set their own).
os.environ["POSENC_FAST_TUNE_FILE"] = os.path.join(tempfile.mkdtemp(prefix="posenc_fast-tests-"), "tune.json")

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs minutes or many GiB (POSENC_FAST_TEST_BIG=1)")
