"""The one wait policy between retries (tenacity), for the daemon and the clients.

``equal_jitter(first, cap)``: half of a doubling delay (``first``, ``2 * first``,
... capped at ``cap``) fixed, the other half random. After an outage, many
tables, batch appliers and subscribers spread their retries over seconds
instead of all retrying at the same instant (plain exponential backoff keeps
them in lockstep, worst of all at the cap); none waits past ``cap``, and none
retries in a tight loop (every wait is at least half the doubling delay).
"""

from __future__ import annotations

from tenacity import wait_exponential, wait_random_exponential
from tenacity.wait import wait_base


def equal_jitter(first: float, cap: float) -> wait_base:
    """Waits of ``first/2 .. first``, then ``first .. 2*first``, ... up to ``cap/2 .. cap``."""
    half_first, half_cap = first / 2, cap / 2
    return wait_exponential(multiplier=half_first, max=half_cap) + wait_random_exponential(
        multiplier=half_first, max=half_cap
    )
