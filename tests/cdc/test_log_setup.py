"""``cdc.logs.setup_logging``: what the sidecar's log keeps of its libraries."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from cdc.logs import setup_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_late_periodic_job_is_not_a_warning_other_scheduler_warnings_are(
    restored_logging: object, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("INFO", json_logs=False)
    scheduler = logging.getLogger("apscheduler.scheduler")

    scheduler.warning(
        'Execution of job "%s" skipped: maximum number of running instances reached (%d)', "watch", 1
    )
    scheduler.warning('Run time of job "%s" was missed by %s', "watch", "0:00:02")

    logged = capsys.readouterr().err
    assert "maximum number of running instances" not in logged
    assert 'Run time of job "watch" was missed' in logged
