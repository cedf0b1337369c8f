"""Bistream parity: our schedule over our torch engine (CPU, fp32, greedy) gives the speech tokens of upstream's
`inference_bistream` on the same tiny synthetic CosyVoice2 / CosyVoice3 LLMs.

`data/bistream_golden.json` holds upstream's tokens for a few cases (prompt speech of 30, 22, 45 and 0 tokens,
a text too short for its prompt speech, deltas of one and of several tokens); see data/bistream_make_golden.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tritontts.checkpoint import read_state_dict, write_safetensors
from tritontts.cosyvoice2.bistream import BistreamTokens, run_bistream
from tritontts.cosyvoice3.convert import convert_cosyvoice3_llm
from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import SamplingParams
from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_cosyvoice2_llm
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files

GOLDEN = json.loads((Path(__file__).parent / "data" / "bistream_golden.json").read_text())
FAMILIES = {"cosyvoice2": BistreamTokens.cosyvoice2(), "cosyvoice3": BistreamTokens.cosyvoice3()}
CASES = [(family, name) for family, cases in GOLDEN["families"].items() for name in cases]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_llm(family: str, root: Path) -> Path:
    """The served LLM directory of the generator's checkpoint (seed and preset of the golden). CosyVoice3's
    conversion keeps Qwen's text rows in lm_head (upstream's converter does too); upstream's CosyVoice3LM has no
    text outputs, and the tiny random model's text rows win now and then, so here they are zero, as in
    CosyVoice2's layout."""
    seed = GOLDEN["seed"]
    if family == "cosyvoice2":
        return write_cosyvoice2_llm(root / "cosyvoice2_llm", "tiny", qwen2lm_state_dict("tiny", seed), seed)
    model_dir = write_cosyvoice3_llm_files(
        write_cosyvoice3_token2wav(root / "cv3", "tiny", seed), "tiny", seed
    )
    out = root / "hf_fp32"
    convert_cosyvoice3_llm(model_dir, out, "float32")
    state = read_state_dict(out / "model.safetensors")
    state["lm_head.weight"][: FAMILIES[family].speech_base] = 0
    write_safetensors(state, out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def llm_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {family: write_llm(family, tmp_path_factory.mktemp(family)) for family in FAMILIES}


@pytest.fixture(scope="module")
def engines(llm_dirs: dict[str, Path]) -> dict[str, LLMEngine]:
    return {
        family: LLMEngine.from_pretrained(
            path, device="cpu", dtype=torch.float32, max_batch_size=1, max_seq_len=1024, cuda_graphs=False
        )
        for family, path in llm_dirs.items()
    }


def engine_runner(engine: LLMEngine, requests: list | None = None):
    def run(ids: list[int], max_tokens: int, end_id: int, bad_ids: tuple[int, ...]) -> Iterator[int]:
        if requests is not None:
            requests.append((len(ids), max_tokens, end_id))
        params = SamplingParams(max_tokens=max_tokens, temperature=0, end_id=end_id, bad_token_ids=bad_ids)
        yield from engine.generate([ids], params)[0]

    return run


def bistream(family: str, case: dict, runner) -> list[int]:
    return list(
        run_bistream(
            case["deltas"],
            runner,
            FAMILIES[family],
            case["prompt_text_ids"],
            case["prompt_speech"],
            max_final_tokens=GOLDEN["final_tokens"],
        )  # fmt: skip
    )


@pytest.mark.golden
@pytest.mark.parametrize(("family", "name"), CASES)
def test_engine_bistream_equals_upstream(engines: dict[str, LLMEngine], family: str, name: str) -> None:
    case = GOLDEN["families"][family][name]
    requests: list = []
    assert bistream(family, case, engine_runner(engines[family], requests)) == case["tokens"]
    assert requests[-1][2] == FAMILIES[family].eos
    assert all(end == FAMILIES[family].fill for _, _, end in requests[:-1])
