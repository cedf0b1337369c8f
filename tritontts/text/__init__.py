"""The text front end: what happens to a request's text before the LLM sees it.

Normalization and segmentation follow upstream CosyVoice's Python front end (`CosyVoiceFrontEnd.text_normalize`
and the helpers of `cosyvoice/utils/frontend_utils.py`), written here from its behaviour:

- normalize.py: Chinese or English text normalization with wetext, English numbers spelled out with inflect, and
  the clean-up rules (blanks, corner marks, brackets); tags such as `[laughter]` and `<strong>` are kept intact,
  and a text holding a special token (`<|endofprompt|>`) is left alone, as upstream leaves it;
- segment.py: `split_paragraph`, sentences merged into segments of 60-80 tokens (a short tail of fewer than 20
  merged into the segment before), and the cut of a segment still longer than a request may be;
- long_form.py: a long text as segments one after another, normalized a block at a time, so the first segment is
  ready before the rest of the text is read.

Why these libraries: wetext is the runtime of WeTextProcessing, the FST grammars upstream normalizes with
(`from wetext import Normalizer`); its wheel ships the compiled FST files, so it works offline, and it needs only
kaldifst and contractions (no pynini, no downloads). inflect is what upstream spells English numbers with. Both
install from PyPI with numpy < 2 (requirements.txt).
"""

from tritontts.text.config import TextConfig
from tritontts.text.long_form import text_segments
from tritontts.text.normalize import TextNormalizer, skips_normalization
from tritontts.text.segment import split_paragraph

__all__ = ["TextConfig", "TextNormalizer", "skips_normalization", "split_paragraph", "text_segments"]
