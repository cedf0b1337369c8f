"""Fun-CosyVoice3-0.5B-2512: what differs from CosyVoice2, read from upstream (FunAudioLLM/CosyVoice @ace7c47).

Facts sheet (sources: `cosyvoice/llm/llm.py` CosyVoice3LM, `cosyvoice/flow/flow.py` CausalMaskedDiffWithDiT,
`cosyvoice/flow/DiT/{dit,modules}.py`, `cosyvoice/flow/flow_matching.py` CausalConditionalCFM,
`cosyvoice/hifigan/{generator,f0_predictor}.py` CausalHiFTGenerator / CausalConvRNNF0Predictor,
`cosyvoice/transformer/{upsample_encoder,convolution}.py`, `examples/libritts/cosyvoice3/conf/cosyvoice3.yaml`,
`runtime/triton_trtllm/{run_cosyvoice3.sh,model_repo_cosyvoice3/*,scripts/convert_cosyvoice3_to_hf.py}`).
The hub's own `cosyvoice3.yaml` could not be read here (no hub access); the sizes below are the example
recipe's, which upstream's runtime loads the same way (`load_hyperpyyaml(cosyvoice3.yaml)`).

Files of `FunAudioLLM/Fun-CosyVoice3-0.5B-2512` the runtime reads: `cosyvoice3.yaml`, `llm.pt`, `flow.pt`,
`hift.pt`, `campplus.onnx`, `speech_tokenizer_v3.onnx`, `CosyVoice-BlankEN/` (Qwen2 config + tokenizer);
`yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX` adds `flow.decoder.estimator.autocast_fp16.onnx` (TensorRT only).

LLM (CosyVoice3LM, vs CosyVoice2's Qwen2LM)
- Qwen2 (hidden 896) + `speech_embedding` [6561 + 200, 896] + `llm_decoder` Linear(896, 6561 + 200, bias=False).
  No `llm_embedding`: sos = 6561, eos = 6562, task_id = 6563, fill = 6564 live INSIDE the speech vocabulary;
  any id >= 6561 stops decoding (`stop_token_ids = 6561..6760`). llm.pt keys: `llm.model.*` (Qwen2ForCausalLM,
  lm_head included), `llm_decoder.weight`, `speech_embedding.weight`.
- Input: [sos_emb, text_emb(prompt_text + text), task_id_emb, speech_emb(prompt speech tokens)]; the text must
  contain `<|endofprompt|>` (id 151646, asserted). Upstream's runtime prefixes the reference text with
  `"You are a helpful assistant.<|endofprompt|>"` when it lacks the marker; instruct is
  `"You are a helpful assistant. <instruction><|endofprompt|>"` in place of that system part.
- HF layout (`convert_cosyvoice3_to_hf.py`): BlankEN tokenizer + CosyVoice3 text specials (`<|im_start|>`,
  `<|im_end|>`, `<|endofprompt|>`, `[breath]`, ... phoneme tokens), then `<|s_0|>..<|s_6760|>` with 6561..6564
  renamed `<|sos|>`, `<|eos1|>`, `<|task_id|>`, `<|fill|>`; vocab padded to a multiple of 128; speech rows of
  `embed_tokens` = `speech_embedding`, `lm_head` = zeros (+ Qwen's text rows) with `llm_decoder` at the speech rows,
  untied; `eos_token_id` = offset + 6562; chat template `<|sos|>` + user + `<|task_id|>` then the assistant
  content (prompt speech tokens as `<|s_N|>` strings) verbatim; `cosyvoice3_metadata.json` records the offsets.
- BLS → trtllm-serve `/v1/chat/completions` (SSE): temperature 0.8, top_p 0.95, top_k 50, repetition penalty
  1.1, max_tokens 750, stop `<|eos1|>`, `<|eos|>`; tokens parsed from `<|s_N|>` in the deltas.

Flow (CausalMaskedDiffWithDiT, vs CausalMaskedDiffWithXvec)
- No conformer encoder: Embedding(6561, 80) → PreLookaheadLayer(80 → 1024 → 80, 3 look-ahead tokens, residual)
  → repeat_interleave x2 (token_mel_ratio) = mu [B, 80, 2N]. Speaker: normalize(x-vector 192) → Linear(192, 80).
- CFM: CosyVoice2's (seed-0 noise `randn(1, 80, 15000)`, cosine schedule, 10 Euler steps, CFG 0.7, batch 2).
- Estimator: F5-TTS style DiT, dim 1024, depth 22, heads 16 x 64, ff_mult 2 (GELU tanh), mel/mu/spk 80:
  input proj Linear(320, 1024) over [x, cond, mu, spk] + causal conv position embedding (2 x grouped conv k31
  g16, left pad 30, Mish), sinusoidal time (256) → MLP, AdaLayerNormZero blocks, rotary (x_transformers, dim 64,
  base 10000, interleaved pairs) applied to the first 64 channels of q and k BEFORE the head split (head 0 only),
  final AdaLN (scale, shift) + Linear(1024, 80). Attention mask: padding only, or chunk-causal over
  static_chunk_size = chunk_size 25 x 2 = 50 mel frames when streaming; outputs of padded frames zeroed.
- token2wav (Triton) returns mel only ([80, -1] fp32); streaming = not finalize; the whole (prompt + tokens)
  sequence is recomputed each call and sliced at token_offset * 2; a non-final call's last 3 tokens are the
  pre-lookahead context.

Vocoder (CausalHiFTGenerator, vs HiFTGenerator): 24 kHz, upsample 8 x 5 x 3, iSTFT n_fft 16 hop 4 (480 samples
per frame); every convolution causal: conv_pre looks 4 frames right (k5), upsampling = nearest x u then a
left-padded conv (k), source downsampling = left-padded strided convs, ResBlocks left-padded; f0 predictor
causal (k4 looking 3 frames right, then 4 x k3 left), run in float64. The NSF source is deterministic at
inference: phase from per-frame increments held (nearest) over each frame, and the noise is a FIXED uniform
tensor `rand(1, 300 * 24000, 9)` drawn at construction from the global RNG (whose state follows the seed-0 CFM
noise and the parameter inits between). Non-final calls drop the last 3 mel frames (f0 look-ahead) and
4 more (conv_pre look-ahead), and the last 480 samples; the Triton vocoder is stateless and re-vocodes the
accumulated mel each chunk.

Front end: `speech_tokenizer_v3.onnx` (25 Hz, 6561 codes; whisper 128-bin log-mel input like v2), CAMPPlus
x-vector (192), prompt mel = matcha mel_spectrogram n_fft 1920, hop 480, win 1920, 80 bins, fmin 0,
fmax None (= 12 kHz; CosyVoice2: 8000), center False; prompt tokens/mel trimmed to a 1:2 ratio for the flow
only (the LLM gets all prompt tokens).

Streaming (BLS): first hop 15 tokens + 3 look-ahead, then 25 * 2^k (exponential) or a time-based strategy.

Where ours differs from upstream's runtime, on purpose or not yet: the LLM gets the reference's speech tokens cut to
the prompt mel (CosyVoice2's service; upstream's BLS gives the LLM the uncut tokens: at most one token more); voices
are cached by audio content (upstream's BLS caches by reference text); generated reserved speech ids are dropped
(upstream's BLS would pass `<|s_6565|>`.. to the flow, whose embedding has 6561 rows); the converter zeroes the
padding rows (upstream leaves resize_token_embeddings' random ones; nothing reads them) and, like upstream, copies
Qwen's text rows into lm_head, so text tokens keep logits in the HF layout.
"""
