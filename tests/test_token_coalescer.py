"""Several steps' tokens per streamed response: the coalescer in front of the LLM model's senders."""

import pytest

from tritontts.llm.sequence import FinishReason, TokenEvent
from tritontts.triton.token_coalescer import TokenCoalescer, auto_interval, parse_stream_interval


def feed(interval: int, events: list[TokenEvent]) -> list[TokenEvent]:
    sent: list[TokenEvent] = []
    coalescer = TokenCoalescer(sent.append, lambda: interval)
    for event in events:
        coalescer(event)
    return sent


def steps(n: int, end: FinishReason | None = FinishReason.END_ID) -> list[TokenEvent]:
    events = [TokenEvent(7, [i]) for i in range(n)]
    return events + ([TokenEvent(7, [], end)] if end else [])


def test_interval_one_forwards_every_token_as_it_comes():
    sent = feed(1, steps(4))
    assert [e.token_ids for e in sent] == [[0], [1], [2], [3], []]
    assert sent[-1].finish_reason == FinishReason.END_ID


def test_tokens_wait_for_the_interval_and_the_end_flushes_the_rest():
    sent = feed(3, steps(7))
    assert [e.token_ids for e in sent] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [e.finished for e in sent] == [False, False, True]


def test_the_last_token_arriving_with_the_finish_is_sent_once():
    sent = feed(4, [TokenEvent(3, [5]), TokenEvent(3, [6], FinishReason.MAX_TOKENS)])
    assert [(e.token_ids, e.finish_reason) for e in sent] == [([5, 6], FinishReason.MAX_TOKENS)]


def test_an_error_is_forwarded_with_what_was_pending():
    sent = feed(5, [TokenEvent(1, [9]), TokenEvent(1, [], FinishReason.ERROR, "boom")])
    assert len(sent) == 1 and sent[0].error == "boom" and sent[0].token_ids == [9]


def test_the_interval_is_read_at_each_token():
    sent: list[TokenEvent] = []
    interval = [1]
    coalescer = TokenCoalescer(sent.append, lambda: interval[0])
    coalescer(TokenEvent(2, [0]))
    interval[0] = 2
    for token in (1, 2, 3):
        coalescer(TokenEvent(2, [token]))
    assert [e.token_ids for e in sent] == [[0], [1, 2]]


@pytest.mark.parametrize(
    ("running", "interval"), [(0, 1), (1, 1), (16, 1), (17, 2), (32, 2), (64, 4), (128, 8), (1000, 8)]
)
def test_auto_interval_grows_with_the_running_requests(running, interval):
    assert auto_interval(running) == interval


def test_stream_interval_parameter():
    assert parse_stream_interval("auto") is None
    assert parse_stream_interval("3") == 3
    for bad in ("0", "-2", "x", ""):
        with pytest.raises(ValueError, match="stream_interval must be 'auto' or a positive integer"):
            parse_stream_interval(bad)
