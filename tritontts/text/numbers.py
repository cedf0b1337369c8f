"""English numbers spelled out, as upstream's `spell_out_number` does after wetext: every run of digits
(`str.isdigit`) becomes inflect's words for it ("1,234" is two runs: "one,two hundred and thirty-four")."""

from __future__ import annotations

from typing import Protocol


class NumberSpeller(Protocol):
    def number_to_words(self, num: str) -> str: ...


def spell_out_numbers(text: str, speller: NumberSpeller) -> str:
    """`text` with each maximal run of digit characters replaced by `speller.number_to_words(run)`."""
    out, start = [], 0
    for i, char in enumerate(text):
        if char.isdigit():
            continue
        if start < i:
            out.append(speller.number_to_words(text[start:i]))
        out.append(char)
        start = i + 1
    if start < len(text):
        out.append(speller.number_to_words(text[start:]))
    return "".join(out)
