"""Generated token ids to text as it streams: incremental decoding, and stop strings cut out of the text."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

INCOMPLETE = "\ufffd"


class IncrementalDecoder:
    """Decodes ids one batch at a time, holding back text while a multi-byte character is incomplete."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def push(self, token_ids: Sequence[int]) -> str:
        self.ids += token_ids
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith(INCOMPLETE):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before) :]


class TextStream:
    """Text safe to send so far: ends before the first stop string, holding back an end that may begin one."""

    def __init__(self, tokenizer: Tokenizer, stop_strings: Sequence[str] = ()) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.longest = max(map(len, self.stop_strings), default=1)
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token_ids: Sequence[int]) -> str:
        """New text to send; sets `stopped` when a stop string appeared (the text ends before it)."""
        return self._append(self.decoder.push(token_ids), final=False)

    def flush(self) -> str:
        """The rest once generation ended."""
        return self._append(self.decoder.flush(), final=True)

    def _append(self, delta: str, final: bool) -> str:
        if self.stopped:
            return ""
        start = max(0, len(self.text) - self.longest + 1)
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stop_strings) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
        else:
            end = len(self.text) if final else max(self.sent, len(self.text) - self._partial_stop())
        out, self.sent = self.text[self.sent : end], end
        return out

    def _partial_stop(self) -> int:
        """Length of the longest end of the text that begins a stop string."""
        return max(
            (k for s in self.stop_strings for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0
        )
