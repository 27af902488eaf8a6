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
