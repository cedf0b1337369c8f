"""Bistream parity: our schedule over our torch engine (CPU, fp32, greedy) gives the speech tokens of upstream's
`inference_bistream` on the same tiny synthetic CosyVoice2 / CosyVoice3 LLMs.

`data/bistream_golden.json` holds upstream's tokens for a few cases (prompt speech of 30, 22, 45 and 0 tokens,
a text too short for its prompt speech, deltas of one and of several tokens); see data/bistream_make_golden.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from cosyvoice2_models import build_cosyvoice2_models
from fastapi.testclient import TestClient
from test_llm_triton import grpc_infer

from tritontts.checkpoint import read_state_dict, write_safetensors
from tritontts.cosyvoice2.bistream import BistreamTokens, run_bistream
from tritontts.cosyvoice3.convert import convert_cosyvoice3_llm
from tritontts.llm.engine import LLMEngine
from tritontts.llm.openai_server.app import ServedModel, create_app
from tritontts.llm.sequence import SamplingParams
from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_cosyvoice2_llm
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files
from tritontts.triton.llm_contract import SamplingParams as ContractParams
from tritontts.triton.llm_contract import llm_request_inputs

GOLDEN = json.loads((Path(__file__).parent / "data" / "bistream_golden.json").read_text())
FAMILIES = {"cosyvoice2": BistreamTokens.cosyvoice2(), "cosyvoice3": BistreamTokens.cosyvoice3()}
CV2 = FAMILIES["cosyvoice2"]
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


SPEECH_TEXT = re.compile(r"<\|s_(\d+)\|>")
END_TOKEN_TEXT = {CV2.fill: "<|eos3|>", CV2.eos: "<|eos1|>"}
SERVER_CASE = ("cosyvoice2", "p22_medium_mixed")


@pytest.mark.golden
def test_openai_server_bistream_equals_upstream(llm_dirs: dict[str, Path]) -> None:
    """Segment requests as /v1/completions with token-id prompts, a stop token and logit_bias -100 bans."""
    family, name = SERVER_CASE
    engine = LLMEngine.from_pretrained(
        llm_dirs[family],
        device="cpu",
        dtype=torch.float32,
        max_batch_size=1,
        max_seq_len=1024,
        cuda_graphs=False,
    )
    with TestClient(create_app(ServedModel.from_model_dir(engine, llm_dirs[family]))) as client:

        def run(ids: list[int], max_tokens: int, end_id: int, bad_ids: tuple[int, ...]) -> Iterator[int]:
            body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "stop": [END_TOKEN_TEXT[end_id]], "logit_bias": {str(t): -100 for t in bad_ids}}  # fmt: skip
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            text = response.json()["choices"][0]["text"]
            yield from (CV2.speech_id(int(n)) for n in SPEECH_TEXT.findall(text))

        case = GOLDEN["families"][family][name]
        assert bistream(family, case, run) == case["tokens"]
        refused = client.post("/v1/completions", json={"prompt": [1], "logit_bias": {"5": -5}})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "logit_bias"


TRITON_MODELS = [build_cosyvoice2_models]
TRITON_LLM = "cosyvoice2_tensorrt_llm_offline"


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(TRITON_LLM)


@pytest.mark.golden
def test_tensorrt_llm_contract_bistream_equals_upstream(server) -> None:
    """The session tritonserver's torch `tensorrt_llm` model (the CosyVoice2 checkpoint of the golden: tiny,
    seed 0, fp32 on CPU) over gRPC: segment requests with request_output_len, end_id and bad_words_list."""

    def run(ids: list[int], max_tokens: int, end_id: int, bad_ids: tuple[int, ...]) -> Iterator[int]:
        params = ContractParams(max_tokens=max_tokens, temperature=1.0, top_k=1, top_p=1.0)
        arrays = llm_request_inputs(np.asarray(ids), end_id, end_id, params, False, bad_ids=bad_ids)
        yield from grpc_infer(server.grpc_url, TRITON_LLM, arrays)

    for name in ("p30_long_single", "p45_short_leftover"):
        case = GOLDEN["families"]["cosyvoice2"][name]
        assert bistream("cosyvoice2", case, run) == case["tokens"]
