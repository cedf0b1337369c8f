"""The bistream schedule on hand-worked cases: 5 text + 15 prompt speech blocks, where segments start and end,
the fill token never fed, the last input fed twice at the end, leftover prompt speech dropped, CosyVoice3's
prompt up to <|endofprompt|> fed after sos, and the errors at the edge."""

from __future__ import annotations

import pytest

from tritontts.cosyvoice2.bistream import BistreamSchedule, BistreamTokens, SegmentPlan, run_bistream

CV2 = BistreamTokens.cosyvoice2()
CV3 = BistreamTokens.cosyvoice3()
S = CV2.speech_base


def sp(*tokens: int, ids: BistreamTokens = CV2) -> list[int]:
    return [ids.speech_id(t) for t in tokens]


def test_family_ids_match_the_merged_vocabularies():
    assert (CV2.sos, CV2.task_id, CV2.eos, CV2.fill) == (S + 6564, S + 6565, S + 6561, S + 6563)
    assert CV2.banned_except(CV2.fill) == (S + 6561, S + 6562, S + 6564, S + 6565)
    b3 = CV3.speech_base
    assert (b3, CV3.sos, CV3.eos, CV3.task_id, CV3.fill) == (
        151924,
        b3 + 6561,
        b3 + 6562,
        b3 + 6563,
        b3 + 6564,
    )
    assert len(CV3.banned_except(CV3.fill)) == 199 and CV3.fill not in CV3.banned_except(CV3.fill)
    assert CV3.eos in CV3.banned_except(CV3.fill) and CV3.eos not in CV3.banned_except(CV3.eos)


def test_no_prompt_speech_waits_for_five_text_tokens_then_fill_and_final_refeed():
    schedule = BistreamSchedule(CV2, [10, 11], [], max_final_tokens=50)
    assert schedule.push_text([20]) is None
    plan = schedule.push_text([21, 22])
    assert plan == SegmentPlan((CV2.sos, 10, 11, 20, 21, 22), 15, CV2.fill, CV2.banned_except(CV2.fill))
    assert schedule.segment_done(sp(1, 2, 3), ended_by_end_id=True) is None  # sampled fill at index 3
    assert schedule.push_text([30, 31, 32]) is None
    assert schedule.push_text([33]) is None
    final = schedule.finish()
    history = (CV2.sos, 10, 11, 20, 21, 22, *sp(1, 2, 3))
    assert final == SegmentPlan((*history, S + 3, 30, 31, 32, 33, CV2.task_id), 50, CV2.eos,
                                CV2.banned_except(CV2.eos), final=True)  # fmt: skip
    assert schedule.segment_done(sp(7), ended_by_end_id=True) is None
    with pytest.raises(ValueError, match="after the final segment"):
        schedule.push_text([1])


def test_forced_fill_then_five_text_tokens_replace_it():
    schedule = BistreamSchedule(CV2, [], [])
    first = schedule.push_text([1, 2, 3, 4, 5])
    assert first.max_new_tokens == 15
    speech = sp(*range(100, 115))
    assert schedule.segment_done(speech, ended_by_end_id=False) is None  # forced fill at index 15
    second = schedule.push_text([6, 7, 8, 9, 10])
    assert second.input_ids == (*first.input_ids, *speech, 6, 7, 8, 9, 10)
    assert second.max_new_tokens == 15  # next fill at 15 + 16 = 31, 16 tokens (fill included) out so far
    schedule.segment_done(sp(5), ended_by_end_id=True)  # sampled fill at 17: next at 33
    third = schedule.push_text([11, 12, 13, 14, 15])
    assert third.input_ids == (*second.input_ids, *sp(5), 11, 12, 13, 14, 15)
    assert third.max_new_tokens == 33 - 18


def test_prompt_speech_interleaves_and_the_first_segment_needs_no_more_text():
    speech = list(range(22))
    schedule = BistreamSchedule(CV2, list(range(1, 11)), speech)
    plan = schedule.push_text([11])
    blocks = (*range(1, 6), *sp(*range(15)), *range(6, 11), *sp(*range(15, 22)))
    assert plan.input_ids == (CV2.sos, *blocks)
    assert plan.max_new_tokens == 8  # (22 // 15 + 1) * 15 - 22
    assert schedule.segment_done(sp(*range(8)), ended_by_end_id=False) is None
    assert schedule.text_cache == [11]


def test_prompt_speech_multiple_of_fifteen_and_leftover_dropped():
    schedule = BistreamSchedule(CV2, [1, 2, 3], list(range(45)), max_final_tokens=9)
    assert schedule.next_fill == 15
    assert schedule.push_text([4]) is None
    final = schedule.finish()
    assert final.input_ids == (CV2.sos, 1, 2, 3, 4, CV2.task_id)
    schedule = BistreamSchedule(CV2, [1, 2, 3], list(range(45)), max_final_tokens=9)
    assert schedule.push_text([4, 5, 6, 7]) is None  # one block in, 30 prompt speech tokens still waiting
    assert schedule.finish().input_ids == (CV2.sos, 1, 2, 3, 4, 5, *sp(*range(15)), 6, 7, CV2.task_id)


def test_cosyvoice3_feeds_the_prompt_to_endofprompt_after_sos_and_decodes_at_the_first_token():
    eop = CV3.end_of_prompt
    schedule = BistreamSchedule(CV3, [5, eop, 7, 8], [])
    plan = schedule.push_text([9])
    assert plan.input_ids == (CV3.sos, 5, eop)
    assert plan.end_id == CV3.fill and CV3.sos in plan.bad_ids and CV3.eos in plan.bad_ids
    assert schedule.text_cache == [7, 8, 9]
    schedule.segment_done(sp(1, ids=CV3), ended_by_end_id=True)
    final = schedule.finish()
    assert final.input_ids == (CV3.sos, 5, eop, *sp(1, 1, ids=CV3), 7, 8, 9, CV3.task_id)
    assert final.end_id == CV3.eos and CV3.fill in final.bad_ids


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: BistreamSchedule(CV3, [5, 6], []), "prompt_text_ids: cosyvoice3 needs <|endofprompt|>"),
        (lambda: BistreamSchedule(CV2, [S], []), "prompt_text_ids"),
        (lambda: BistreamSchedule(CV2, [1], [6561]), "prompt_speech"),
        (lambda: BistreamSchedule(CV2, [1], [], max_final_tokens=0), "max_final_tokens"),
        (lambda: BistreamSchedule(CV2, [1], []).push_text([CV2.fill]), "text"),
    ],
)
def test_bad_inputs_name_their_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_results_out_of_order_are_refused():
    schedule = BistreamSchedule(CV2, [1, 2, 3, 4], [])
    with pytest.raises(ValueError, match="without a planned segment"):
        schedule.segment_done([], ended_by_end_id=True)
    schedule.push_text([5])
    with pytest.raises(ValueError, match="segment_done first"):
        schedule.push_text([6])
    with pytest.raises(ValueError, match="speech tokens"):
        schedule.segment_done([CV2.eos], ended_by_end_id=True)
    with pytest.raises(ValueError, match="no end id"):
        schedule.segment_done(sp(1, 2), ended_by_end_id=False)


def test_run_bistream_streams_speech_and_reads_the_end_id_either_way():
    calls = []
    replies = iter([[*sp(1, 2), CV2.fill, *sp(9)], sp(*range(20, 33)), [*sp(4), CV2.eos]])

    def runner(ids, max_tokens, end_id, bad_ids):
        calls.append((len(ids), max_tokens, end_id))
        yield from next(replies)

    out = list(run_bistream([[1, 2], [3, 4, 5], [6, 7, 8, 9, 10]], runner, CV2, [], [], max_final_tokens=7))
    assert out == [1, 2, *range(20, 33), 4]
    # a runner that stops short of max_tokens without the end id ended there (the engine drops the end id)
    assert calls == [(6, 15, CV2.fill), (6 + 2 + 5, 18 - 3, CV2.fill), (13 + 13 + 2, 7, CV2.eos)]
