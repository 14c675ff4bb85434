"""The adaptive empty-poll backoff of DESIGN.md §3.

``backoff: [[5, 50ms], [20, 200ms], [100, 1s], [null, 5s]]`` reads: after up
to 5 empty polls in a row wait 50 ms, up to 20 wait 200 ms, up to 100 wait
1 s, beyond that 5 s. Any poll that finds changes resets the count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EmptyPollBackoff:
    steps: tuple[tuple[int | None, float], ...]
    empty_polls: int = 0

    def record(self, found_changes: bool) -> None:
        self.empty_polls = 0 if found_changes else self.empty_polls + 1

    @property
    def delay(self) -> float:
        """How long to wait before the next poll."""
        if self.empty_polls == 0:
            return 0.0
        for limit, wait in self.steps:
            if limit is None or self.empty_polls <= limit:
                return wait
        return self.steps[-1][1]

    @property
    def step(self) -> int:
        """Index of the current step (for metrics): -1 while polling back to back."""
        if self.empty_polls == 0:
            return -1
        for index, (limit, _) in enumerate(self.steps):
            if limit is None or self.empty_polls <= limit:
                return index
        return len(self.steps) - 1
