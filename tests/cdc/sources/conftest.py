"""The PostgreSQL logical-capture harness, for the source tests of this folder."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.contract.harness import PostgresLogicalHarness


@pytest.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[PostgresLogicalHarness]:
    """A logical-capture source on the session's PostgreSQL (or a module's own
    ``postgres_dsn``, which overrides it), torn down after the test."""
    async with PostgresLogicalHarness.running(request) as running:
        assert isinstance(running, PostgresLogicalHarness)
        yield running
