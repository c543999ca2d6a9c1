"""Shared pytest configuration: hypothesis profiles.

``HYPOTHESIS_PROFILE=thorough`` runs many more random examples than CI's
default profile.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs minutes or many GiB (POSENC_FAST_TEST_BIG=1)")
