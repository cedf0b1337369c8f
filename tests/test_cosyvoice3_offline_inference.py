"""offline_inference.py --model cosyvoice3 (run.sh stage 9) on CPU with the tiny synthetic checkpoint: the whole
pipeline in one process, forced token counts, exact audio lengths and the report; the same prompts as the BLS's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_cosyvoice3 import CosyVoice3Pipeline
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt
from tritontts.synthetic.cosyvoice3_checkpoint import write_cosyvoice3_checkpoint

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_cosyvoice3_checkpoint(tmp_path_factory.mktemp("cosy3_offline"), "tiny", 0)


def test_two_batch_sizes_give_forced_lengths_and_a_report(checkpoint, bench_data, tmp_path):
    command = [sys.executable, "offline_inference.py", "--model", "cosyvoice3", "--model-dir", str(checkpoint),
               "--huggingface-dataset", str(bench_data), "--batch-sizes", "1,2", "--max-new-tokens", "300",
               "--realistic-lengths", "--limit-rows", "2", "--log-dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "offline_cosyvoice3_torch.json").read_text())
    assert report["model"] == "cosyvoice3" and [r["batch_size"] for r in report["results"]] == [1, 2]
    for result in report["results"]:
        for record in result["records"]:
            assert record["speech_tokens"] == record["forced_tokens"] > 0
            assert soundfile.info(record["wav"]).frames == 960 * record["forced_tokens"]


def test_prompt_ids_are_the_bls_ones(checkpoint):
    prompter = CosyVoice3Prompt.from_llm_dir(checkpoint / "hf_cosyvoice3_llm")
    pipeline = CosyVoice3Pipeline(prompter, None, None, None, None)  # type: ignore[arg-type]
    row = Utterance(id="x", prompt_text="参考文本。", target_text="目标。", prompt_audio=np.zeros(16000, np.float32),
                    sample_rate=16000)  # fmt: skip
    voice = type("Voice", (), {"speech_tokens": np.arange(5, dtype=np.int32)})()
    prompt = pipeline._prompt(row, voice)
    assert prompt.reference_text == "You are a helpful assistant.<|endofprompt|>参考文本。"
    assert prompt.ids.tolist() == prompter.input_ids("参考文本。", "目标。", range(5))
