"""tritontts.stream_states: per-stream state that a stream's end, or its silence, drops."""

from __future__ import annotations

import pytest

from tritontts.stream_states import StreamStates


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_state_lives_until_its_stream_ends():
    states: StreamStates[str] = StreamStates(60.0, Clock())
    assert states.get("a") is None
    states.put("a", "state of a")
    assert states.get("a") == "state of a"
    assert states.holds("a", "state of a")
    states.pop("a")
    states.pop("never opened")
    assert states.get("a") is None and states.ids() == []


def test_a_stream_quiet_for_the_idle_timeout_is_dropped_and_a_used_one_is_kept():
    clock = Clock()
    states: StreamStates[object] = StreamStates(60.0, clock)
    kept, abandoned = object(), object()
    states.put("kept", kept)
    states.put("abandoned", abandoned)
    clock.now += 40
    assert states.get("kept") is kept  # used: its 60 s start again
    clock.now += 20
    assert sorted(states.ids()) == ["abandoned", "kept"]  # exactly 60 s quiet is not yet too long
    clock.now += 0.5
    assert states.ids() == ["kept"]
    assert not states.holds("abandoned", abandoned)
    clock.now += 60.5
    states.put("new", object())  # any use drops what went quiet
    assert states.ids() == ["new"]


def test_holds_tells_a_replaced_state_apart():
    states: StreamStates[object] = StreamStates(60.0, Clock())
    old, new = object(), object()
    states.put("a", old)
    states.put("a", new)
    assert states.holds("a", new) and not states.holds("a", old)


def test_a_state_kept_after_a_call_counts_as_used():
    clock = Clock()
    states: StreamStates[object] = StreamStates(60.0, clock)
    state = object()
    states.put("a", state)
    clock.now += 50
    assert states.holds("a", state)  # the call that began 50 s ago ends now
    clock.now += 50
    assert states.ids() == ["a"]


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_the_idle_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="idle_timeout_s must be > 0"):
        StreamStates(timeout)


def test_a_deep_copy_keeps_the_states_with_a_lock_of_its_own():
    import copy

    states: StreamStates[list] = StreamStates(60.0, Clock())
    states.put("a", [1])
    copied = copy.deepcopy(states)
    assert copied.get("a") == [1] and copied.get("a") is not states.get("a")
    copied.pop("a")
    assert states.ids() == ["a"] and copied.ids() == []
