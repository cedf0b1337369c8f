"""The text front end (tritontts.text) against upstream CosyVoice's own `text_normalize` on a set of sentences
(tests/data/text_frontend_upstream.json, made once by tests/data/text_frontend_make_upstream.py), and the parts
that go beyond upstream: tags kept, long texts a block at a time, segments cut to a request's length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritontts.text import TextConfig, TextNormalizer, split_paragraph, text_segments
from tritontts.text.cleanup import is_only_punctuation, replace_blank
from tritontts.text.long_form import blocks, prompt_prefix
from tritontts.text.request import normalized_texts, wants_normalization
from tritontts.text.segment import fit_segment
from tritontts.text.tags import tags_of
from tritontts.triton.params import RequestError

UPSTREAM = json.loads((Path(__file__).parent / "data" / "text_frontend_upstream.json").read_text())
CASES = UPSTREAM["cases"]


@pytest.fixture(scope="module")
def normalizer() -> TextNormalizer:
    return TextNormalizer()


def test_the_data_names_its_upstream_commit():
    assert "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40" in UPSTREAM["note"]
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c["input"][:30] for c in CASES])
def test_normalized_as_upstream(normalizer, case):
    assert normalizer.normalize(case["input"]) == case["normalized"]


PLAIN = [c for c in CASES if "<|" not in c["input"]]


@pytest.mark.parametrize("case", PLAIN, ids=[c["input"][:30] for c in PLAIN])
def test_segments_as_upstream(normalizer, case):
    assert list(text_segments(case["input"], normalizer)) == case["segments"]


def test_upstream_leaves_special_token_texts_alone_and_so_do_we(normalizer):
    for case in CASES:
        if "<|" in case["input"]:
            assert normalizer.normalize(case["input"]) == case["input"] == case["normalized"]
            # upstream does not split them; we keep the part up to <|endofprompt|> on every segment (one here)
            assert list(text_segments(case["input"], normalizer)) == case["segments"]


@pytest.mark.parametrize("case", [c for c in CASES if tags_of(c["input"])], ids=lambda c: c["input"][:30])
def test_tags_stay_intact(normalizer, case):
    assert tags_of(normalizer.normalize(case["input"])) == tags_of(case["input"])
    assert tags_of("".join(text_segments(case["input"], normalizer))) == tags_of(case["input"])


def test_a_tag_wetext_would_change_is_put_back(normalizer):
    normalizer.normalize("warm up")

    class Mangling:  # a grammar that rewrites brackets: the text between the tags goes through it alone
        def normalize(self, text):
            return text.replace("[", "(").replace("]", ")").replace("2", "two")

    real, normalizer._en = normalizer._en, Mangling()
    try:
        assert normalizer.normalize("I have 2 cats [laughter] and <strong>2</strong> dogs.") == (
            "I have two cats [laughter] and <strong>two</strong> dogs."
        )
    finally:
        normalizer._en = real


def test_a_sentence_wetext_fails_on_is_kept_and_the_others_normalized(normalizer):
    # wetext 0.1.8 raises an AssertionError on ") <3 </3" (upstream's front end would raise too)
    assert (
        normalizer.normalize("I have 3 cats. ok :) ;) <3 </3") == "I have three cats. ok :) ;) <three </three"
    )
    assert normalizer.normalize("😼9!") == "😼nine!"


def test_split_paragraph_merges_sentences_and_a_short_tail():
    s22 = "一二三四五六七八九十" * 2 + "一。"
    # 66 > 60 characters and 88 > 80 with the next: cut; the tail (24) is long enough to stand alone
    assert split_paragraph(s22 * 4 + "好。", "zh") == [s22 * 3, s22 + "好。"]
    s30 = ("一二三四五六七八九十" * 3)[:29] + "。"
    # 90 after three (60 was not > 60): cut before "好。", which (2 < 20) is merged back
    assert split_paragraph(s30 * 3 + "好。", "zh") == [s30 * 3 + "好。"]
    assert split_paragraph("no end", "en") == ["no end."]
    assert split_paragraph(
        "a, b, c", "en", TextConfig(comma_split=True, token_max_n=1, token_min_n=0, merge_len=0)
    ) == [
        "a,",
        " b,",
        " c.",
    ]


def test_fit_segment_cuts_at_blanks_commas_or_between_cjk_and_never_inside_a_word():
    assert fit_segment("aaa bbb ccc", 8) == ["aaa bbb", "ccc"]
    assert fit_segment("aaa,bbb,ccc", 5) == ["aaa,", "bbb,", "ccc"]
    assert fit_segment("一二三四五六七", 3) == ["一二三", "四五六", "七"]
    assert fit_segment("x" * 12, 5) == ["x" * 12]
    assert fit_segment("short", 10) == ["short"]


def test_helpers():
    assert replace_blank("我们 用 Python 3 写 代码") == "我们用Python 3写代码"
    assert is_only_punctuation("。！？...") and is_only_punctuation("") and not is_only_punctuation("a.")
    assert prompt_prefix("You are.<|endofprompt|>Hi.") == ("You are.<|endofprompt|>", "Hi.")
    assert prompt_prefix("Hi.") == ("", "Hi.")
    text = "One. Two!\nThree? " * 50
    assert "".join(blocks(text, 40)) == text and max(len(b) for b in blocks(text, 40)) <= 40


class CountingNormalizer(TextNormalizer):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def normalize(self, text, lang=None):
        self.calls.append(text)
        return super().normalize(text, lang)


def test_a_long_text_is_normalized_a_block_at_a_time():
    paragraph = "On March 5, 2024, the firm sold 1,234 units at $19.99 each, up 12%. " * 3 + "\n"
    text = paragraph * 100  # about 20,000 characters
    normalizer = CountingNormalizer()
    segments = text_segments(text, normalizer, TextConfig(max_segment_chars=300))
    first = next(segments)
    assert first.startswith("On the fifth of march") and len(normalizer.calls) == 1  # the first block only
    rest = list(segments)
    assert len(normalizer.calls) == len(list(blocks(text, 600))) == 50  # two paragraphs fit a block
    assert len(rest) + 1 >= 50
    assert all(len(s) <= 300 for s in [first, *rest])
    assert not any(ch.isdigit() for s in rest for ch in s)


def test_without_normalization_a_long_text_is_only_cut(normalizer):
    words = [f"word{i}" for i in range(3000)]
    text = " ".join(words[:1500]) + ". " + "，".join(["中文"] * 10) + "。 " + " ".join(words[1500:])
    segments = list(text_segments(text, normalizer, TextConfig(normalize=False, max_segment_chars=200)))
    assert all(len(s) <= 200 for s in segments) and len(segments) > 100
    spoken = " ".join(segments).replace("，", " ").replace("。", " ").replace(".", " ").split()
    assert [w for w in spoken if w.startswith("word")] == words  # nothing lost, in order, digits as written


def test_a_prompt_prefix_goes_with_every_segment(normalizer):
    prefix = "You are a helpful assistant. 请用广东话说<|endofprompt|>"
    body = "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。" * 6
    segments = list(text_segments(prefix + body, normalizer, TextConfig(max_segment_chars=120)))
    assert len(segments) > 2 and all(s.startswith(prefix) and len(s) <= 120 for s in segments)
    assert "".join(s.removeprefix(prefix) for s in segments) == body  # not normalized, as upstream


def test_nothing_to_speak_is_sent_as_written(normalizer):
    assert list(text_segments(" ... ", normalizer)) == ["..."]


def test_the_bls_switch(normalizer):
    from tritontts.spark.service import SparkRequest

    assert wants_normalization({}, True) and not wants_normalization({}, False)
    assert not wants_normalization({"text_normalization": False}, True)
    with pytest.raises(RequestError) as err:
        wants_normalization({"text_normalization": "no"}, True)
    assert err.value.field == "text_normalization"
    request = normalized_texts(SparkRequest(None, "我有3个。", "I have 3 cats."), normalizer)
    assert (request.reference_text, request.target_text) == ("我有三个。", "I have three cats.")
