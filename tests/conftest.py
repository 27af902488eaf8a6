"""One hypothesis profile for the whole suite: fixed examples (derandomized, no example
database), no deadline (machines are shared and loaded; no wall-clock assertion belongs in the
default run), and slow data generation allowed. Each test sets only its number of examples."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "parplan",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("parplan")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_extra_searches(monkeypatch, request):
    """The continuous-share searches that certificates and the global bound add on top of their
    own results (5 s per split, 10 s for the root bound: docs/costmodel.md section 8) are
    switched off in the default run, where they cost about 50 s of the suite's CPU and no test
    reads them but the ones in tests/test_continuous.py and tests/test_bound.py, which set the
    product's limits or call the searches directly; the slow set keeps them on."""
    if request.node.get_closest_marker("slow") is None:
        import parplan.solvers.bound as bound
        import parplan.solvers.exact as exact

        monkeypatch.setattr(exact, "CONTINUOUS_TIME_S", 0.0)
        monkeypatch.setattr(bound, "ROOT_SEARCH_S", 0.0)
