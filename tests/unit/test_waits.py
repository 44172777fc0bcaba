"""The test suite's own waits (tests/helpers.py): a wait whose work advances outlasts its
timeout; one whose work stalls fails; a test that drives the work fails only past both its
rounds and its minimum time."""

from __future__ import annotations

import time

import pytest

from ..helpers import Patience, repeat_until, wait_until


def test_a_wait_whose_work_advances_outlasts_its_timeout():
    start = time.monotonic()
    done_at = start + 0.6
    value = wait_until(
        lambda: time.monotonic() > done_at and "done",
        timeout=0.2,
        progress=lambda: int((time.monotonic() - start) / 0.05),  # a step every 50 ms
    )
    assert value == "done" and time.monotonic() - start >= 0.6


def test_a_wait_whose_work_stalls_fails_after_its_timeout():
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="with no progress waiting for steps"):
        wait_until(lambda: False, timeout=0.2, message="steps", progress=lambda: 7)
    assert 0.2 <= time.monotonic() - start < 5


def test_driving_the_work_fails_only_past_its_rounds_and_its_minimum_time():
    rounds = repeat_until(lambda: None, iter([False] * 500 + [True]).__next__, 10, "x", 60.0)
    assert rounds == 500  # past at_most, but not yet past the minute: went on
    patience = Patience(at_most=10, at_least_s=0.0)
    assert not patience.spent(9) and patience.spent(10)
    with pytest.raises(pytest.fail.Exception, match="not done after 3 rounds"):
        repeat_until(lambda: None, lambda: False, 3, "never", at_least_s=0.0)
