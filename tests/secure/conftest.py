"""The secured profile's tests use the live-stack fixtures of tests/integration."""

from tests.integration.conftest import engine  # noqa: F401 - a fixture, used by name
