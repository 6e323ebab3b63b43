"""The dashboard's AppTest factory, for the verdict's surface tests."""
from tests.dashboard.conftest import make_app  # noqa: F401  (a fixture, used by name)
