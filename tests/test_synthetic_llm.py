import hashlib
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from tritontts.checkpoint import read_state_dict
from tritontts.spark import tokens as layout
from tritontts.synthetic.qwen2 import qwen2_config, write_qwen2
from tritontts.synthetic.spark import length_counter, row_weights, write_spark_llm
from tritontts.synthetic.tokenizer import build_spark_tokenizer

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "make_synthetic_checkpoint.py"
TEXTS = [
    "Hello world! It's 10:30, isn't it?",
    "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。",
    "Mixed 中文 and English 文本, 123.",
]


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory) -> Path:
    return write_spark_llm(tmp_path_factory.mktemp("LLM"), "tiny", seed=0)


def test_special_tokens_sit_at_layout_ids(llm_dir):
    tokenizer = Tokenizer.from_file(str(llm_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == layout.LAST_TOKEN_ID + 1
    for content, token_id in layout.token_ids().items():
        assert tokenizer.token_to_id(content) == token_id, content
    assert tokenizer.token_to_id("<|endoftext|>") == 151643
    assert tokenizer.token_to_id("<|im_end|>") == 151645
    assert tokenizer.token_to_id("<|file_sep|>") == 151664
    assert tokenizer.token_to_id(layout.global_token(0)) == 151665
    assert tokenizer.token_to_id(layout.semantic_token(8191)) == 163952
    added = json.loads((llm_dir / "added_tokens.json").read_text())
    assert added == layout.token_ids()
    assert len(json.loads((llm_dir / "vocab.json").read_text())) == layout.BPE_VOCAB_SIZE


def test_tokenizer_loads_in_transformers_and_round_trips(llm_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(llm_dir))
    fast = Tokenizer.from_file(str(llm_dir / "tokenizer.json"))
    assert hf.eos_token == layout.EOS_TOKEN and hf.pad_token == layout.PAD_TOKEN
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ids == fast.encode(text).ids
        assert max(ids) < layout.BPE_VOCAB_SIZE
        assert hf.decode(ids) == text
    prompt = "<|task_tts|><|start_content|>你好<|end_content|><|bicodec_global_17|><|bicodec_semantic_42|>"
    ids = hf(prompt)["input_ids"]
    assert ids[:2] == [165137, 165146] and ids[-2:] == [151665 + 17, 155761 + 42]
    assert hf.decode(ids, skip_special_tokens=True) == prompt


def test_qwen2_loads_in_transformers_with_varied_finite_logits(llm_dir):
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen2ForCausalLM.from_pretrained(str(llm_dir)).eval()
    assert model.config.vocab_size == layout.VOCAB_SIZE and model.config.tie_word_embeddings
    with torch.no_grad():
        logits = model(torch.tensor([[165137, 165146, 100, 200, 165152]])).logits
        # enough text that speech (and so greedy decoding) runs past 16 tokens before the end token
        prompt = torch.tensor([[165137, 165146, 100, 200, 300, 400, 500]])
        generated = model.generate(prompt, max_new_tokens=16, do_sample=False)
    assert torch.isfinite(logits).all()
    assert len(set(logits[0].argmax(-1).tolist())) > 1
    assert len(set(generated[0, 7:].tolist())) > 3


def test_full_config_has_the_real_values():
    config = qwen2_config("full")
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    expected = {
        "vocab_size": 166000,
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "torch_dtype": "float32",
        "use_sliding_window": False,
    }
    assert {k: config[k] for k in expected} == expected


def test_weight_names_and_dtype(llm_dir):
    state = read_state_dict(llm_dir / "model.safetensors")
    assert "lm_head.weight" not in state
    assert state["model.embed_tokens.weight"].shape == (166000, 64)
    assert state["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert state["model.layers.0.self_attn.q_proj.bias"].shape == (64,)
    assert len(state) == 1 + 2 * 12 + 1
    assert all(t.dtype == torch.float32 for t in state.values())


def test_sharded_weights_match_single_file(tmp_path, llm_dir):
    speech = (layout.SEMANTIC_BASE, layout.SEMANTIC_BASE + layout.SEMANTIC_COUNT)
    options = {"speech_tokens": speech, "counter": length_counter(), "row_weights": row_weights()}
    written = write_qwen2(tmp_path, "tiny", seed=0, max_shard_size="20MB", **options)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    assert {p.name for p in written} >= set(index["weight_map"].values())
    sharded = read_state_dict(tmp_path / "model.safetensors.index.json")
    single = read_state_dict(llm_dir / "model.safetensors")
    assert sharded.keys() == single.keys()
    assert all(torch.equal(sharded[k], single[k]) for k in single)
    transformers = pytest.importorskip("transformers")
    build_spark_tokenizer(tmp_path)
    transformers.Qwen2ForCausalLM.from_pretrained(str(tmp_path))


def test_same_seed_same_bytes(tmp_path, llm_dir):
    again = write_spark_llm(tmp_path / "again", "tiny", seed=0)
    assert _digest(again) == _digest(llm_dir)
    other = write_qwen2(tmp_path / "other", "tiny", seed=1)
    assert other[-1].read_bytes() != (llm_dir / "model.safetensors").read_bytes()


def test_full_checkpoint_layout_and_script(tmp_path):
    from tritontts.spark.layout import missing_files

    out = tmp_path / "spark"
    command = [
        sys.executable,
        str(SCRIPT),
        "--output-dir",
        str(out),
    ]
    first = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "wrote a synthetic" in first.stdout
    assert missing_files(out) == []
    assert json.loads((out / "SYNTHETIC.json").read_text())["preset"] == "tiny"
    second = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "already holds" in second.stdout


def _load_script():
    spec = importlib.util.spec_from_file_location("make_synthetic_checkpoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_is_idempotent_and_refuses_foreign_dirs(tmp_path, monkeypatch, capsys):
    from tritontts.spark.layout import REQUIRED_FILES

    script = _load_script()
    calls = []

    def fake_write(out_dir, preset, seed):
        calls.append((preset, seed))
        for name in (*REQUIRED_FILES, "wav2vec2-large-xlsr-53/pytorch_model.bin", "LLM/model.safetensors"):
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (out_dir / name).write_text("x")
        (out_dir / "SYNTHETIC.json").write_text(json.dumps({"preset": preset, "seed": seed}))
        return out_dir

    monkeypatch.setattr(script, "write_spark_checkpoint", fake_write)
    out = tmp_path / "ckpt"
    assert script.main(["--output-dir", str(out)]) == 0
    assert script.main(["--output-dir", str(out)]) == 0
    assert "already holds" in capsys.readouterr().out
    assert script.main(["--output-dir", str(out), "--seed", "3"]) == 0
    assert script.main(["--output-dir", str(out), "--force"]) == 0
    assert calls == [("tiny", 0), ("tiny", 3), ("tiny", 0)]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    assert script.main(["--output-dir", str(foreign)]) == 1
    assert calls[-1] == ("tiny", 0) and len(calls) == 3


def test_dtype_override_reaches_weights_and_config(tmp_path):
    write_qwen2(tmp_path, "tiny", seed=0, dtype=torch.bfloat16)
    state = read_state_dict(tmp_path / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_spark_llm_samples_speech_tokens(llm_dir):
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen2ForCausalLM.from_pretrained(str(llm_dir)).eval()
    ids = load_prompt_ids(llm_dir)
    torch.manual_seed(0)
    out = model.generate(ids, do_sample=True, top_k=50, top_p=0.95, temperature=0.8, max_new_tokens=60)
    generated = out[0, ids.shape[1] :].tolist()
    semantic = [
        t for t in generated if layout.SEMANTIC_BASE <= t < layout.SEMANTIC_BASE + layout.SEMANTIC_COUNT
    ]
    assert len(semantic) == len(generated) == 60
    assert len(set(semantic)) > 20


def load_prompt_ids(llm_dir: Path) -> torch.Tensor:
    from tritontts.spark.prompt import build_voice_clone_prompt, load_llm_tokenizer

    text = build_voice_clone_prompt(
        "参考。", "Hello there, this sentence takes a while.", range(32), range(40)
    )
    return torch.tensor([load_llm_tokenizer(llm_dir).encode(text, add_special_tokens=False).ids])
