"""A command whose reader went away (``cdc subscribe ... | head``)."""

from __future__ import annotations

import os
import sys


def stdout_to_devnull() -> None:
    """What is left in stdout's buffer goes nowhere, not to a traceback at
    exit (Python flushes stdout then, and the closed pipe would raise)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
