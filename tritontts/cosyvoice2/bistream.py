"""Bistream at the LLM level: text tokens fed into a running CosyVoice2 / CosyVoice3 utterance.

The schedule reproduces upstream's `Qwen2LM.inference_bistream` (which `CosyVoice3LM` inherits) as a chain of
*segment requests* over the plain LLM contract (docs/streaming-text.md, "Bistream"): each request's input ids are
everything the model was fed so far plus the new input, in the merged vocabulary of the served LLM. A segment
ends at the fill token: sampled (the request's end id) or forced where upstream forces it (the request's
max new tokens). The fill token itself is never fed; the next 5 text tokens take its place. Speech-head rows that
upstream never lets through in a phase are the request's bad ids.

One text token is one step of the schedule (upstream's text generator yields token by token); a step runs at
most one segment. Quirks kept on purpose: prompt speech that the text does not cover is dropped, and at the end
of the text the input that was last fed (the last speech token, usually) is fed a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from tritontts.cosyvoice2 import tokens as cv2
from tritontts.cosyvoice3 import tokens as cv3

MIX_TEXT, MIX_SPEECH = 5, 15
"""Text tokens, then prompt speech tokens, per interleaved block (upstream's mix_ratio)."""
DEFAULT_MAX_FINAL_TOKENS = 2048

SegmentRunner = Callable[[list[int], int, int, tuple[int, ...]], Iterable[int]]
"""(input ids, max new tokens, end id, bad ids) -> the generated ids (the end id may or may not come last)."""


@dataclass(frozen=True)
class BistreamTokens:
    """Merged-vocabulary ids of one family's LLM that the schedule feeds or masks."""

    family: str
    speech_base: int
    sos: int
    task_id: int
    eos: int
    fill: int
    head_specials: tuple[int, ...]
    """ids past the speech tokens that the served LLM's speech head covers (upstream's rows >= 6561)"""
    end_of_prompt: int | None = None

    @classmethod
    def cosyvoice2(cls) -> BistreamTokens:
        base = cv2.ORIGINAL_VOCAB_SIZE
        after = {name: base + cv2.SPEECH_TOKEN_COUNT + i for i, name in enumerate(cv2.TOKENS_AFTER_SPEECH)}
        return cls("cosyvoice2", base, after[cv2.SOS_TOKEN], after[cv2.TASK_ID_TOKEN], after[cv2.END_TOKEN],
                   after["<|eos3|>"], tuple(after.values()))  # fmt: skip

    @classmethod
    def cosyvoice3(cls) -> BistreamTokens:
        base = cv3.TEXT_VOCAB_SIZE
        row = {name: base + index for index, name in cv3.RENAMED.items()}
        specials = tuple(range(base + cv3.SPEECH_TOKEN_COUNT, base + cv3.SPEECH_VOCAB))
        return cls("cosyvoice3", base, row[cv3.SOS_TOKEN], row[cv3.TASK_ID_TOKEN], row[cv3.END_TOKEN],
                   row["<|fill|>"], specials, cv3.END_OF_PROMPT_ID)  # fmt: skip

    def speech_id(self, token: int) -> int:
        return self.speech_base + token

    def speech_index(self, token_id: int) -> int | None:
        index = token_id - self.speech_base
        return index if 0 <= index < cv2.SPEECH_TOKEN_COUNT else None

    def banned_except(self, allowed: int) -> tuple[int, ...]:
        return tuple(t for t in self.head_specials if t != allowed)


@dataclass(frozen=True)
class SegmentPlan:
    """One request: generate at most `max_new_tokens` after `input_ids`, stop at `end_id`, never `bad_ids`."""

    input_ids: tuple[int, ...]
    max_new_tokens: int
    end_id: int
    bad_ids: tuple[int, ...]
    final: bool = False


@dataclass
class BistreamSchedule:
    """Upstream's bistream loop as a state machine: `push_text`, `finish` and `segment_done` each return the next
    segment to run, or None when the schedule waits for more text (or, after the final segment, is done)."""

    tokens: BistreamTokens
    prompt_text_ids: Sequence[int]
    prompt_speech: Sequence[int]
    max_final_tokens: int = DEFAULT_MAX_FINAL_TOKENS
    fed: list[int] = field(default_factory=list, init=False)
    lm_input: list[int] = field(default_factory=list, init=False)
    text_cache: list[int] = field(default_factory=list, init=False)
    speech_left: list[int] = field(default_factory=list, init=False)
    queued: list[int] = field(default_factory=list, init=False)
    out_count: int = field(default=0, init=False)
    last_was_fill: bool = field(default=False, init=False)
    next_fill: int = field(default=0, init=False)
    finished: bool = field(default=False, init=False)
    plan: SegmentPlan | None = field(default=None, init=False)
    done: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        ids = self.tokens
        text = _text_ids("prompt_text_ids", self.prompt_text_ids, ids)
        speech = [int(t) for t in self.prompt_speech]
        if any(not 0 <= t < cv2.SPEECH_TOKEN_COUNT for t in speech):
            raise ValueError(f"prompt_speech: tokens must be in [0, {cv2.SPEECH_TOKEN_COUNT})")
        if self.max_final_tokens < 1:
            raise ValueError(f"max_final_tokens must be >= 1, got {self.max_final_tokens}")
        self.lm_input = [ids.sos]
        if ids.end_of_prompt is not None:
            if ids.end_of_prompt not in text:
                raise ValueError(
                    f"prompt_text_ids: {ids.family} needs <|endofprompt|> ({ids.end_of_prompt}) in the prompt text"
                )
            cut = text.index(ids.end_of_prompt) + 1
            self.lm_input += text[:cut]
            text = text[cut:]
        self.text_cache = text
        self.speech_left = [ids.speech_id(t) for t in speech]
        self.next_fill = (len(speech) // MIX_SPEECH + 1) * MIX_SPEECH - len(speech)

    def push_text(self, token_ids: Sequence[int]) -> SegmentPlan | None:
        self._expect_no_plan("push_text")
        if self.finished:
            raise ValueError("push_text after finish")
        self.queued += _text_ids("text", token_ids, self.tokens)
        return self._advance()

    def finish(self) -> SegmentPlan | None:
        self._expect_no_plan("finish")
        self.finished = True
        return self._advance()

    def segment_done(self, token_ids: Sequence[int], ended_by_end_id: bool) -> SegmentPlan | None:
        """The planned segment's generated ids (without its end id); `ended_by_end_id`: it stopped there."""
        plan = self.plan
        if plan is None:
            raise ValueError("segment_done without a planned segment")
        generated = [int(t) for t in token_ids]
        if any(self.tokens.speech_index(t) is None for t in generated):
            raise ValueError(f"segment tokens must be speech tokens, got {generated}")
        if len(generated) > plan.max_new_tokens or (
            not ended_by_end_id and len(generated) < plan.max_new_tokens
        ):
            raise ValueError(
                f"a segment of {plan.max_new_tokens} tokens returned {len(generated)}, no end id"
            )
        self.plan = None
        if plan.final:
            self.done = True
            return None
        self.fed += self.lm_input + generated
        if generated:
            self.lm_input = generated[-1:]
        self.out_count += len(generated)
        self.next_fill = self.out_count + MIX_SPEECH + 1
        self.out_count += 1
        self.last_was_fill = True
        return self._advance()

    def _expect_no_plan(self, what: str) -> None:
        if self.plan is not None:
            raise ValueError(f"{what} while a segment is planned: call segment_done first")
        if self.done:
            raise ValueError(f"{what} after the final segment")

    def _advance(self) -> SegmentPlan | None:
        while self.queued:
            self.text_cache.append(self.queued.pop(0))
            plan = self._step()
            if plan is not None:
                return self._planned(plan)
        if self.finished and not self.done:
            self.lm_input += [*self.text_cache, self.tokens.task_id]
            self.text_cache = []
            eos = self.tokens.eos
            final = SegmentPlan(
                self._input(), self.max_final_tokens, eos, self.tokens.banned_except(eos), True
            )
            return self._planned(final)
        return None

    def _step(self) -> SegmentPlan | None:
        while self.speech_left and len(self.text_cache) >= MIX_TEXT:
            self.lm_input += self.text_cache[:MIX_TEXT] + self.speech_left[:MIX_SPEECH]
            del self.text_cache[:MIX_TEXT], self.speech_left[:MIX_SPEECH]
        if self.speech_left:
            return None
        if self.last_was_fill or (self.out_count == 0 and len(self.lm_input) == 1):
            if len(self.text_cache) < MIX_TEXT:
                return None
            text = self.text_cache[:MIX_TEXT]
            self.lm_input = text if self.last_was_fill else self.lm_input + text
            del self.text_cache[:MIX_TEXT]
        fill = self.tokens.fill
        return SegmentPlan(
            self._input(), self.next_fill - self.out_count, fill, self.tokens.banned_except(fill)
        )

    def _input(self) -> tuple[int, ...]:
        return (*self.fed, *self.lm_input)

    def _planned(self, plan: SegmentPlan) -> SegmentPlan:
        self.plan = plan
        return plan


def _text_ids(name: str, token_ids: Sequence[int], ids: BistreamTokens) -> list[int]:
    text = [int(t) for t in token_ids]
    if any(not 0 <= t < ids.speech_base for t in text):
        raise ValueError(f"{name}: text token ids must be in [0, {ids.speech_base})")
    return text


def run_segment(plan: SegmentPlan, runner: SegmentRunner) -> Iterator[int | None]:
    """The segment's speech token ids as they come, then None if it ended at its end id."""
    count = 0
    with _closing(runner(list(plan.input_ids), plan.max_new_tokens, plan.end_id, plan.bad_ids)) as tokens:
        for token in tokens:
            if token == plan.end_id:
                yield None
                return
            yield token
            count += 1
            if count == plan.max_new_tokens:
                return
    if count < plan.max_new_tokens:
        yield None


@contextmanager
def _closing(tokens: Iterable[int]) -> Iterator[Iterator[int]]:
    """The runner's tokens, closed (a request cut short, or abandoned, is cancelled) when the block is left."""
    iterator = iter(tokens)
    try:
        yield iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def run_bistream(
    deltas: Iterable[Sequence[int]],
    segment_runner: SegmentRunner,
    tokens: BistreamTokens,
    prompt_text_ids: Sequence[int],
    prompt_speech: Sequence[int],
    max_final_tokens: int = DEFAULT_MAX_FINAL_TOKENS,
) -> Iterator[int]:
    """Speech tokens (0..6560) of one utterance as they come, its text arriving as `deltas` of text token ids."""
    schedule = BistreamSchedule(tokens, prompt_text_ids, prompt_speech, max_final_tokens)

    def drain(plan: SegmentPlan | None) -> Iterator[int]:
        while plan is not None:
            generated, ended = [], False
            with _closing(run_segment(plan, segment_runner)) as segment:
                for token in segment:
                    if token is None:
                        ended = True
                        break
                    index = tokens.speech_index(token)
                    if index is None:
                        raise ValueError(
                            f"the LLM returned {token}, not a speech token, in a bistream segment"
                        )
                    generated.append(token)
                    yield index
            plan = schedule.segment_done(generated, ended)

    for delta in deltas:
        yield from drain(schedule.push_text(delta))
    yield from drain(schedule.finish())
