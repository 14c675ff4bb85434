"""The one wait policy between retries: doubling, capped, and never in lockstep."""

from __future__ import annotations

from tenacity import RetryCallState

from publishers.retrying import equal_jitter


def waits(attempt: int, first: float = 0.5, cap: float = 5.0, samples: int = 200) -> list[float]:
    policy = equal_jitter(first, cap)
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = attempt
    return [policy(state) for _ in range(samples)]


def test_the_delay_doubles_from_first_and_half_of_it_is_random() -> None:
    for attempt, full in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0)):
        seen = waits(attempt)
        assert all(full / 2 <= w <= full for w in seen), (attempt, min(seen), max(seen))
        assert max(seen) - min(seen) > full / 4  # spread, not one instant for every retrier


def test_no_wait_passes_the_cap_and_retriers_at_the_cap_do_not_line_up() -> None:
    seen = waits(30)
    assert all(2.5 <= w <= 5.0 for w in seen)
    assert len({round(w, 3) for w in seen}) > 100
