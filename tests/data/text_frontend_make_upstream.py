"""Run upstream's text front end ONCE on the sentences below; store its outputs for tests/test_text_frontend.py.

Not a test and not part of the package: it documents how `text_frontend_upstream.json` was made. Upstream:
FunAudioLLM/CosyVoice @ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40, files `cosyvoice/utils/frontend_utils.py` and
`cosyvoice/cli/frontend.py`, taken out of the repository into a folder outside this one. `frontend.py` imports
torch, whisper and onnxruntime for its other methods, so only the source of its `text_normalize` method is taken
(by `ast`) and run, unchanged, on an object that carries what that method reads: wetext normalizers built as
upstream's `__init__` builds them (`Normalizer(remove_erhua=False)`, `Normalizer()`), `inflect.engine()`,
`text_frontend = "wetext"`, and a tokenizer whose `encode` returns the pieces tritontts.text.tokens counts (the
speech API's count; upstream passes the LLM's tokenizer, which the API does not have).

    git -C CosyVoice show ace7c47:cosyvoice/utils/frontend_utils.py > /tmp/up/frontend_utils.py
    git -C CosyVoice show ace7c47:cosyvoice/cli/frontend.py > /tmp/up/frontend.py
    python tests/data/text_frontend_make_upstream.py /tmp/up   # with wetext, inflect and regex installed
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import inflect
import wetext

from tritontts.text.tokens import _PIECE

COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"
OUTPUT = Path(__file__).with_name("text_frontend_upstream.json")

SENTENCES = [
    # numbers, dates, times, currency, percent, units
    "I have 3 apples and 25 oranges.",
    "The meeting is on Jan. 5, 2024 at 3:30pm.",
    "It costs $12.50, or about €11.",
    "Sales rose 12% to 1,234,567 units in 2023.",
    "The rope is 15m long and weighs 2.5kg.",
    "Call 911 or dial 1-800-555-0199 now.",
    "He finished 1st, she finished 22nd.",
    "The temperature dropped to -5°C overnight.",
    "Dr. Smith lives at 221B Baker St. in London.",
    "It is 3/4 full.",
    "今天是2024年3月5日，星期二。",
    "这件衣服售价¥128.50元，打8折。",
    "会议在下午3:30开始，预计持续2小时。",
    "今年的增长率是12.5%，比去年高3个百分点。",
    "这个房间有25m²，层高3m。",
    "温度是-3.5°C，湿度为80%。",
    "他的电话是13812345678。",
    # mixed Chinese and English
    "CosyVoice2在2024年发布了v2.0版本，速度提升了50%。",
    "我们用 Python 3.11 写了 100 行代码。",
    "这是 AI 时代, 也是 GPU 的时代,",
    # brackets, blanks, dashes, newlines, quotes
    "（注意）请带好【身份证】和`钥匙`——谢谢。",
    "北京 - 上海的高铁很快。",
    "第一行\n第二行\n第三行",
    '他说："我明天来。"然后走了。',
    'She said, "I will come tomorrow." Then she left.',
    "Really?! Yes... I think so.",
    "真的吗？！是的。。。",
    # tags kept intact
    "Hello [laughter] nice to meet you, I have 2 cats.",
    "我有[laughter]3个苹果<strong>很好吃</strong>。",
    "That was <strong>really</strong> funny [breath] wasn't it?",
    "You are a helpful assistant.<|endofprompt|>I bought 3 books in 2024.",
    "You are a helpful assistant.<|endofprompt|>收到好友从远方寄来的生日礼物。",
    # only punctuation, no final punctuation
    "Hello world",
    "你好世界",
    # long paragraphs: several segments
    "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。"
    "2024年3月5日，我们一起去了公园，看到了很多美丽的花。那天的天气非常好，阳光明媚，微风不燥。"
    "我们在湖边坐了2个小时，聊了很多关于未来的计划。后来，我们又去吃了一顿丰盛的晚餐，花了大约300元。"
    "回家的路上，我们还买了一些水果和零食。这真是美好的一天！希望以后还能有这样的机会。",
    "On March 5, 2024, the company sold 1,234 units at $19.99 each. That was a 12% rise over 2023. "
    "The CEO said the growth came from new markets in Asia and Europe. She expects sales to double by 2026. "
    "Analysts were not so sure; several of them pointed to rising costs. Still, the stock rose 7% that day. "
    "Employees will get a bonus of $500 each. The next report is due on June 30. "
    "Many people wonder what comes next? Only time will tell!",
    "Short one. Another short one. A third one that is a little bit longer than the others before it. "
    "And then a very long sentence that goes on and on, with many words, clauses and commas, until it is clearly "
    "longer than eighty tokens all by itself, which means that the segmentation has to put it on its own, because "
    "nothing breaks it up before its final full stop, no matter how many words come before that stop arrives. Ok.",
]


def upstream_frontend(folder: Path):
    """An object carrying upstream's `text_normalize` method and what it reads."""
    spec = importlib.util.spec_from_file_location("frontend_utils", folder / "frontend_utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    source = (folder / "frontend.py").read_text()
    method = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "text_normalize"
    )
    namespace = vars(utils) | {"Generator": type(x for x in ()), "partial": __import__("functools").partial}
    namespace |= {"json": json, "logging": __import__("logging"), "re": __import__("re")}
    exec(textwrap.dedent(ast.get_source_segment(source, method)), namespace)

    class Tokenizer:
        def encode(self, text, allowed_special=None):
            return _PIECE.findall(text)

    class FrontEnd:
        text_normalize = namespace["text_normalize"]

        def __init__(self):
            self.tokenizer = Tokenizer()
            self.allowed_special = "all"
            self.inflect_parser = inflect.engine()
            self.zh_tn_model = wetext.Normalizer(remove_erhua=False)
            self.en_tn_model = wetext.Normalizer()
            self.text_frontend = "wetext"

    return FrontEnd()


def main(folder: str) -> None:
    frontend = upstream_frontend(Path(folder))
    cases = [
        {
            "input": text,
            "normalized": frontend.text_normalize(text, split=False),
            "segments": frontend.text_normalize(text, split=True),
        }
        for text in SENTENCES
    ]
    versions = {m: importlib.metadata.version(m) for m in ("wetext", "inflect", "kaldifst", "contractions")}
    note = (
        f"upstream FunAudioLLM/CosyVoice @{COMMIT}: CosyVoiceFrontEnd.text_normalize(text, split=False) and "
        "(text, split=True) with its wetext front end; tokenizer: tritontts.text.tokens' piece count; "
        "made by tests/data/text_frontend_make_upstream.py"
    )
    OUTPUT.write_text(
        json.dumps({"note": note, "versions": versions, "cases": cases}, ensure_ascii=False, indent=1) + "\n"
    )


if __name__ == "__main__":
    import importlib.metadata

    main(sys.argv[1])
