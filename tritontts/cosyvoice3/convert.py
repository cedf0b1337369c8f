"""CosyVoice3's LLM (`llm.pt` + `CosyVoice-BlankEN/`) → one Hugging Face Qwen2ForCausalLM directory.

What upstream's `runtime/triton_trtllm/scripts/convert_cosyvoice3_to_hf.py` makes (and what
`yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF` ships), written without transformers:
- tokenizer: BlankEN's BPE, CosyVoice3Tokenizer's special tokens, then the 6761 speech rows as `<|s_N|>`
  (6561..6564 named `<|sos|> <|eos1|> <|task_id|> <|fill|>`); eos and pad `<|endoftext|>` in the tokenizer,
  the chat template `<|sos|>` + user + `<|task_id|>` then the assistant content verbatim;
- weights: the Qwen2 of `llm.pt`, the vocabulary padded to a multiple of 128; `embed_tokens` rows of the
  speech tokens = `speech_embedding`; an untied `lm_head` holding Qwen's text rows (as upstream copies them),
  `llm_decoder` at the speech rows, zeros elsewhere (upstream leaves resize_token_embeddings' random rows
  in the padding; nothing reads them);
- config: `vocab_size` padded, `tie_word_embeddings` false, `eos_token_id` `<|eos1|>`; generation config and
  `cosyvoice3_metadata.json` as upstream's.

    python -m tritontts.cosyvoice3.convert --model-dir Fun-CosyVoice3-0.5B-2512 --output-dir hf_cosyvoice3_llm
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from tritontts.checkpoint import CheckpointError, read_state_dict, write_safetensors
from tritontts.cosyvoice2 import tokens as cv2
from tritontts.cosyvoice3 import tokens as cv3
from tritontts.cosyvoice3.config import load_cosyvoice3_config
from tritontts.spark.tokens import AddedToken
from tritontts.synthetic.tokenizer import SpecialTokens, write_qwen2_tokenizer

BLANK_EN = "CosyVoice-BlankEN"
LLM_FILE = "llm.pt"
METADATA_FILE = "cosyvoice3_metadata.json"
CHAT_TEMPLATE = (
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{- '<|sos|>' + message['content'] + '<|task_id|>' }}{%- elif message['role'] == 'assistant' %}"
    "{{- message['content']}}{%- endif %}{%- endfor %}"
)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
GENERATION = {
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 25,
    "repetition_penalty": 1.1,
    "max_new_tokens": 2048,
}
LLM_PREFIX = "llm.model."


def read_bpe(blank_en: Path) -> tuple[dict[str, int], list[list[str]]]:
    vocab = json.loads((blank_en / "vocab.json").read_text(encoding="utf-8"))
    lines = (blank_en / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [line.split(" ") for line in lines if line and not line.startswith("#version")]
    return vocab, merges


def read_added(blank_en: Path) -> list[AddedToken]:
    config = json.loads((blank_en / "tokenizer_config.json").read_text(encoding="utf-8"))
    decoder = config.get("added_tokens_decoder") or {}
    return [
        AddedToken(int(i), t["content"], bool(t.get("special", True))) for i, t in sorted(decoder.items())
    ]


def added_tokens(vocab_size: int, blank_en_added: list[AddedToken], speech_rows: int) -> list[AddedToken]:
    """BlankEN's added tokens, the new text specials (special), then the speech rows (not special)."""
    tokens = list(blank_en_added)
    known = {t.content for t in tokens}
    next_id = max([vocab_size - 1, *(t.id for t in tokens)]) + 1
    for content in cv3.text_special_tokens():
        if content not in known:
            tokens.append(AddedToken(next_id, content, True))
            next_id += 1
    tokens += [AddedToken(next_id + i, cv3.speech_token(i), False) for i in range(speech_rows)]
    return tokens


def split_llm_state(state: dict[str, torch.Tensor], speech_rows: int) -> tuple[dict[str, torch.Tensor], ...]:
    """(Qwen2 weights with HF names, speech_embedding, llm_decoder); any other key is an error naming it."""
    qwen = {k.removeprefix(LLM_PREFIX): v for k, v in state.items() if k.startswith(LLM_PREFIX)}
    extra = sorted(
        k
        for k in state
        if not k.startswith(LLM_PREFIX) and k not in {"speech_embedding.weight", "llm_decoder.weight"}
    )
    if extra:
        raise CheckpointError(
            f"{LLM_FILE}: unexpected keys {extra} (not a CosyVoice3LM: llm_decoder has a bias?)"
        )
    for key in ("speech_embedding.weight", "llm_decoder.weight"):
        if key not in state:
            raise CheckpointError(f"{LLM_FILE}: missing {key}")
        if state[key].shape[0] != speech_rows:
            raise CheckpointError(f"{LLM_FILE}: {key} has {state[key].shape[0]} rows, {speech_rows} expected")
    return qwen, state["speech_embedding.weight"], state["llm_decoder.weight"]


def convert_cosyvoice3_llm(model_dir: str | Path, output_dir: str | Path, dtype: str = "bfloat16") -> dict:
    """Write the HF directory; returns the metadata (also written to cosyvoice3_metadata.json)."""
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    blank_en = model_dir / BLANK_EN
    llm = load_cosyvoice3_config(model_dir).llm
    rows = llm.speech_vocab
    qwen, speech_embedding, decoder = split_llm_state(read_state_dict(model_dir / LLM_FILE), rows)
    vocab, merges = read_bpe(blank_en)
    blank_added = read_added(blank_en)
    base_vocab = max([len(vocab) - 1, *(t.id for t in blank_added)]) + 1
    tokens = added_tokens(len(vocab), blank_added, rows)
    speech_offset = tokens[-rows].id
    padded = cv3.padded_vocab_size(speech_offset + rows)

    embed = qwen["model.embed_tokens.weight"].float()
    hidden = embed.shape[1]
    lm_head_text = qwen.pop("lm_head.weight", embed).float()
    new_embed = torch.zeros(padded, hidden)
    kept = min(embed.shape[0], padded)
    new_embed[:kept] = embed[:kept]
    new_embed[speech_offset : speech_offset + rows] = speech_embedding.float()
    lm_head = torch.zeros(padded, hidden)
    lm_head[:speech_offset] = lm_head_text[:speech_offset]
    lm_head[speech_offset : speech_offset + rows] = decoder.float()
    qwen["model.embed_tokens.weight"] = new_embed
    qwen["lm_head.weight"] = lm_head
    torch_dtype = DTYPES[dtype]
    output_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors({k: v.to(torch_dtype) for k, v in qwen.items()}, output_dir / "model.safetensors")

    eos_id = speech_offset + llm.speech_token_size + 1
    config = json.loads((blank_en / "config.json").read_text())
    config.update(vocab_size=padded, tie_word_embeddings=False, eos_token_id=eos_id, torch_dtype=dtype,
                  architectures=["Qwen2ForCausalLM"])  # fmt: skip
    (output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": eos_id, "pad_token_id": eos_id}
    (output_dir / "generation_config.json").write_text(json.dumps(generation | GENERATION, indent=2) + "\n")
    special = SpecialTokens(cv2.TEXT_EOS_TOKEN, cv2.TEXT_EOS_TOKEN, tuple(cv3.text_special_tokens()))
    write_qwen2_tokenizer(output_dir, tokens, special, chat_template=CHAT_TEMPLATE, bpe=(vocab, merges))
    metadata = {
        "original_vocab_size": base_vocab,
        "text_vocab_size": speech_offset,
        "base_speech_token_size": llm.speech_token_size,
        "embedding_size": rows,
        "padded_vocab_size": padded,
        "eos_token_id": eos_id,
        "speech_token_offset": speech_offset,
        "dtype": dtype,
    }
    (output_dir / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return metadata


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", required=True, help="holds cosyvoice3.yaml, llm.pt, CosyVoice-BlankEN/"
    )
    parser.add_argument("--output-dir", default=None, help="default: <model-dir>/hf_merged (upstream's)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    out = args.output_dir or str(Path(args.model_dir) / "hf_merged")
    try:
        metadata = convert_cosyvoice3_llm(args.model_dir, out, args.dtype)
    except (CheckpointError, ValueError, FileNotFoundError) as err:
        print(f"convert: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}: {json.dumps(metadata)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
