"""The cluster profile's tests use the live-stack fixtures of tests/integration."""

from tests.integration.conftest import engine, search  # noqa: F401 - fixtures, used by name
