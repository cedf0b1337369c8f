"""Engine semantics on CPU: in-flight batching, slots, sampling, streaming, cancellation."""

import queue

import pytest
import torch

from tritontts.llm.config import Qwen2Config
from tritontts.llm.engine import LLMEngine
from tritontts.llm.loader import build_model
from tritontts.llm.model import decoder_layer
from tritontts.llm.sampling import (
    SamplingBatch,
    apply_repetition_penalty,
    sample,
    top_k_top_p_keep,
    uniform_noise,
)
from tritontts.llm.sequence import FinishReason, SamplingParams
from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict

VOCAB = 1000
PROMPTS = [
    [5, 17, 912, 33, 4, 250, 251, 7, 99, 640, 3],
    [8, 9],
    [100, 200, 300, 400, 500],
    [42] * 7,
    [3, 1, 4, 1, 5],
]
SAMPLED = SamplingParams(
    max_tokens=16, temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.3, seed=1234
)
GREEDY = SamplingParams(max_tokens=16, temperature=0)


@pytest.fixture(scope="module")
def model():
    config = Qwen2Config.from_dict(qwen2_config("tiny", vocab_size=VOCAB))
    return build_model(
        config, qwen2_state_dict("tiny", seed=3, vocab_size=VOCAB), "cpu", torch.float32, "synthetic"
    )


def make_engine(model, max_batch_size=4, **options) -> LLMEngine:
    return LLMEngine.from_model(
        model, max_batch_size=max_batch_size, max_seq_len=96, max_top_k=VOCAB, **options
    )


def alone(model, prompt, params):
    return make_engine(model, max_batch_size=1).generate([prompt], params)[0]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_mixed_lengths_equal_one_at_a_time(model, params):
    batched = make_engine(model, max_batch_size=3).generate(PROMPTS, params)
    assert batched == [alone(model, p, params) for p in PROMPTS]
    assert len(set(map(tuple, batched))) == len(PROMPTS)


def test_padded_buckets_give_the_same_tokens(model):
    padded = make_engine(model, max_batch_size=8, cuda_graphs=True).generate(PROMPTS[:3], SAMPLED)
    assert padded == make_engine(model).generate(PROMPTS[:3], SAMPLED)


def test_requests_joining_mid_run_match_running_alone(model):
    engine = make_engine(model)
    outputs = {}

    def collect(event):
        outputs.setdefault(event.request_id, []).extend(event.token_ids)

    first = engine.add_request(PROMPTS[0], SAMPLED, collect)
    for _ in range(5):
        engine.step()
    second = engine.add_request(PROMPTS[1], GREEDY, collect)
    engine.step()
    third = engine.add_request(PROMPTS[2], SAMPLED, collect)
    while engine.has_work():
        engine.step()
    assert outputs[first] == alone(model, PROMPTS[0], SAMPLED)
    assert outputs[second] == alone(model, PROMPTS[1], GREEDY)
    assert outputs[third] == alone(model, PROMPTS[2], SAMPLED)


def test_seed_reproducible_and_seeds_differ(model):
    again = alone(model, PROMPTS[0], SAMPLED)
    assert again == alone(model, PROMPTS[0], SAMPLED)
    other = SamplingParams(**{**SAMPLED.__dict__, "seed": 99})
    assert alone(model, PROMPTS[0], other) != again


def test_max_tokens_min_tokens_and_end_id(model):
    free = alone(model, PROMPTS[0], SamplingParams(max_tokens=12, temperature=0))
    assert len(free) == 12
    end_id = free[4]
    first_end = free.index(end_id)
    stopped = alone(model, PROMPTS[0], SamplingParams(max_tokens=12, temperature=0, end_id=end_id))
    assert stopped == free[:first_end]
    late = alone(model, PROMPTS[0], SamplingParams(max_tokens=12, temperature=0, end_id=end_id, min_tokens=6))
    assert len(late) >= 6 and end_id not in late[:6]


def test_finish_reasons_and_streaming_events(model):
    engine = make_engine(model)
    events = queue.Queue()
    end_id = alone(model, PROMPTS[1], GREEDY)[3]
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0), events.put)
    engine.add_request(PROMPTS[1], SamplingParams(max_tokens=50, temperature=0, end_id=end_id), events.put)
    while engine.has_work():
        engine.step()
    seen = {}
    while not events.empty():
        event = events.get()
        assert event.request_id not in seen or seen[event.request_id][-1] is None, "event after final"
        seen.setdefault(event.request_id, []).append(event.finish_reason)
    assert seen[0][-1] == FinishReason.MAX_TOKENS and seen[0][:-1] == [None] * 4
    assert seen[1][-1] == FinishReason.END_ID


def test_cancel_frees_the_slot_for_a_new_request(model):
    engine = make_engine(model, max_batch_size=2)
    finals = {}

    def collect(event):
        if event.finished:
            finals[event.request_id] = event.finish_reason

    long = SamplingParams(max_tokens=80, temperature=0)
    a = engine.add_request(PROMPTS[0], long, collect)
    b = engine.add_request(PROMPTS[1], long, collect)
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == [a, b]
    engine.cancel(a)
    c = engine.add_request(PROMPTS[2], SAMPLED, collect)
    engine.step()
    assert finals[a] == FinishReason.CANCELLED
    assert [s.request_id for s in engine.scheduler.running] == [b, c]
    while engine.has_work():
        engine.step()
    assert engine.scheduler.running == [] and finals[c] == FinishReason.MAX_TOKENS
    outputs = {}
    engine2 = make_engine(model, max_batch_size=2)
    engine2.add_request(
        PROMPTS[2], SAMPLED, lambda e: outputs.setdefault(e.request_id, []).extend(e.token_ids)
    )
    while engine2.has_work():
        engine2.step()
    assert outputs[0] == alone(model, PROMPTS[2], SAMPLED)


def test_cancel_while_waiting_and_with_all_slots_busy(model):
    engine = make_engine(model, max_batch_size=1)
    finals = {}

    def collect(event):
        if event.finished:
            finals[event.request_id] = event.finish_reason

    running = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0), collect)
    waiting = engine.add_request(PROMPTS[1], GREEDY, collect)
    engine.step()
    engine.cancel(waiting)
    engine.cancel(12345)
    engine.step()
    assert finals == {waiting: FinishReason.CANCELLED}
    while engine.has_work():
        engine.step()
    assert finals[running] == FinishReason.MAX_TOKENS


def test_moved_slot_keeps_generating_the_same_tokens(model):
    engine = make_engine(model, max_batch_size=3)
    outputs = {}
    short = SamplingParams(max_tokens=3, temperature=0)
    ids = [
        engine.add_request(p, params, lambda e: outputs.setdefault(e.request_id, []).extend(e.token_ids))
        for p, params in [(PROMPTS[0], short), (PROMPTS[3], SAMPLED), (PROMPTS[2], GREEDY)]
    ]
    while engine.has_work():
        engine.step()
    assert outputs[ids[1]] == alone(model, PROMPTS[3], SAMPLED)
    assert outputs[ids[2]] == alone(model, PROMPTS[2], GREEDY)


def test_background_thread_serves_concurrent_generate(model):
    engine = make_engine(model)
    engine.start()
    try:
        assert engine.generate(PROMPTS[:3], SAMPLED) == [alone(model, p, SAMPLED) for p in PROMPTS[:3]]
        stream = queue.Queue()
        engine.add_request(PROMPTS[0], SamplingParams(max_tokens=4, temperature=0), stream.put)
        tokens = []
        while not (event := stream.get(timeout=30)).finished:
            tokens += event.token_ids
        assert tokens + event.token_ids == alone(
            model, PROMPTS[0], SamplingParams(max_tokens=4, temperature=0)
        )
    finally:
        engine.stop()


def test_bad_requests_are_refused(model):
    engine = make_engine(model)
    with pytest.raises(ValueError):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError):
        engine.add_request([VOCAB], GREEDY)
    with pytest.raises(ValueError):
        engine.add_request([1] * 96, GREEDY)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    assert engine.generate([[1] * 90], SamplingParams(max_tokens=50, temperature=0)) != []
    assert len(engine.generate([[1] * 90], SamplingParams(max_tokens=50, temperature=0))[0]) == 6


def test_repetition_penalty_equals_transformers():
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    history = torch.tensor([[1, 2, 2, 7], [0, 49, 3, 3], [10, 11, 12, 13]])
    penalty = torch.tensor([1.3, 1.3, 1.3])
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter_(1, history, True)
    reference = transformers.RepetitionPenaltyLogitsProcessor(1.3)(history, logits.clone())
    assert torch.allclose(apply_repetition_penalty(logits, seen, penalty), reference)


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.8), (10, 0.7), (50, 0.3), (1, 0.9)])
def test_top_k_top_p_mask_equals_transformers(top_k, top_p):
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(top_k)) * 2
    reference = logits.clone()
    if top_k > 0:
        reference = transformers.TopKLogitsWarper(top_k)(None, reference)
    if top_p < 1:
        reference = transformers.TopPLogitsWarper(top_p)(None, reference)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    keep = top_k_top_p_keep(sorted_logits, torch.full((4,), top_k), torch.full((4,), top_p))
    ours = torch.zeros_like(keep).scatter_(1, order, keep)
    assert torch.equal(ours, reference > float("-inf"))


def test_sampling_follows_the_distribution_and_is_batch_invariant():
    vocab, draws = 8, 4000
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0]) + 1e-12).repeat(draws, 1)

    def batch(rows, seed_offset=0):
        return SamplingBatch(
            temperature=torch.ones(rows),
            top_k=torch.zeros(rows, dtype=torch.int64),
            top_p=torch.ones(rows),
            repetition_penalty=torch.ones(rows),
            seed=torch.arange(rows) + seed_offset,
            end_id=torch.full((rows,), -1),
            min_tokens=torch.zeros(rows, dtype=torch.int64),
            step=torch.zeros(rows, dtype=torch.int64),
            seen=torch.zeros(rows, vocab, dtype=torch.bool),
        )

    tokens = sample(logits, batch(draws), max_top_k=vocab)
    freq = torch.bincount(tokens, minlength=vocab).float() / draws
    assert torch.allclose(freq, torch.tensor([0.4, 0.3, 0.2, 0.1, 0, 0, 0, 0]), atol=0.03)
    assert torch.equal(sample(logits[:1], batch(1, 17), vocab), tokens[17:18])
    noise = uniform_noise(torch.tensor([1, 2]), torch.tensor([0, 0]), torch.arange(100000).repeat(2, 1))
    assert 0 < noise.min() and noise.max() < 1 and abs(noise.mean() - 0.5) < 0.01


MIXED = [[(7 * i + 3 * n) % VOCAB for i in range(n)] for n in (4, 40, 6, 45, 3, 2)]


@pytest.mark.parametrize("fresh", [False, True], ids=["from_cache", "fresh"])
def test_batched_prefill_equals_prefilling_each_alone(model, fresh):
    from tritontts.llm.kv_cache import KVCache

    model.init_rope(96)
    prompts = [MIXED[0], MIXED[1], MIXED[4], MIXED[3]]
    width = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    lengths = torch.tensor([len(p) for p in prompts])
    batched = KVCache(model.config, len(prompts) + 1, 96, torch.device("cpu"), torch.float32)
    single = KVCache(model.config, len(prompts) + 1, 96, torch.device("cpu"), torch.float32)
    for buffer in (*batched.k, *batched.v):
        buffer.fill_(7.0)
    with torch.inference_mode():
        positions = torch.arange(width).expand(len(prompts), width)
        logits = model(
            ids, positions, batched.k, batched.v, slice(1, 5), kv_len=width, lengths=lengths, fresh=fresh
        )
        for row, prompt in enumerate(prompts):
            alone_logits = model(
                torch.tensor([prompt]),
                torch.arange(len(prompt)).unsqueeze(0),
                single.k,
                single.v,
                slice(row + 1, row + 2),
                kv_len=len(prompt),
            )
            assert (logits[row] - alone_logits[0]).abs().max() <= 1e-4, row
            for ours, reference in zip((*batched.k, *batched.v), (*single.k, *single.v)):
                real = len(prompt)
                assert (ours[row + 1, :, :real] - reference[row + 1, :, :real]).abs().max() <= 1e-4
                assert torch.all(ours[row + 1, :, real:] == 7.0), "padding wrote the cache"
    assert torch.all(batched.k[0][0] == 7.0), "a slot outside the batch was written"


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_prefill_of_very_different_lengths_equals_one_at_a_time(model, params):
    assert max(map(len, MIXED)) >= 10 * min(map(len, MIXED))
    batched = make_engine(model, max_batch_size=6).generate(MIXED, params)
    assert batched == [alone(model, p, params) for p in MIXED]
    smaller = make_engine(model, max_batch_size=4).generate(MIXED, params)  # admitted in two prefills
    assert smaller == batched


def test_max_prefill_tokens_splits_the_prefill_with_the_same_tokens(model):
    from tritontts.llm.buckets import prefill_chunks

    lengths = [len(p) for p in MIXED]
    assert prefill_chunks(lengths, 8192) == [6]
    assert prefill_chunks(lengths, 90) == [2, 4, 6]
    assert prefill_chunks(lengths, 50) == [1, 2, 3, 4, 6]
    assert prefill_chunks([5, 5, 5], 1) == [1, 2, 3]
    split = make_engine(model, max_batch_size=6, max_prefill_tokens=90).generate(MIXED, SAMPLED)
    assert split == make_engine(model, max_batch_size=6).generate(MIXED, SAMPLED)


def test_requests_finishing_at_prefill_and_joining_mid_run_in_a_batch(model):
    engine = make_engine(model)
    outputs, finals = {}, {}

    def collect(event):
        outputs.setdefault(event.request_id, []).extend(event.token_ids)
        if event.finished:
            finals[event.request_id] = event.finish_reason

    one = SamplingParams(max_tokens=1, temperature=0)
    first = engine.add_request(MIXED[1], SAMPLED, collect)
    engine.step()
    engine.step()
    joined = [(MIXED[0], one), (MIXED[3], GREEDY), (MIXED[2], one), (MIXED[4], SAMPLED), (MIXED[5], GREEDY)]
    ids = [engine.add_request(p, params, collect) for p, params in joined]
    cancelled = engine.add_request(MIXED[2], GREEDY, collect)
    engine.cancel(cancelled)
    while engine.has_work():
        engine.step()
    assert outputs[first] == alone(model, MIXED[1], SAMPLED)
    for request_id, (prompt, params) in zip(ids, joined):
        assert outputs[request_id] == alone(model, prompt, params), request_id
    assert finals[ids[0]] == FinishReason.MAX_TOKENS and len(outputs[ids[0]]) == 1
    assert finals[cancelled] == FinishReason.CANCELLED and outputs[cancelled] == []


def test_bucket_helpers(model):
    from tritontts.llm.buckets import bucket_of, kv_buckets, prefill_buckets

    assert kv_buckets(2560) == [256, 512, 1024, 2048, 2560]
    assert kv_buckets(96) == [96]
    assert prefill_buckets(300) == [32, 64, 96, 128, 192, 256]
    assert [bucket_of([8, 16, 32], n) for n in (1, 8, 9, 32)] == [8, 8, 16, 32]
    runner = make_engine(model, kv_lengths=[16, 40]).runner
    assert runner.kv_lengths == [16, 40, 96]
    assert [runner.kv_bucket(n) for n in (1, 16, 17, 41, 500)] == [16, 16, 40, 96, 96]


def test_padded_prefill_of_one_prompt_into_a_slot_named_by_a_tensor(model):
    """The bucketed prefill a CUDA graph captures: a prompt padded to the bucket, its cache row a tensor."""
    from tritontts.llm.kv_cache import KVCache

    model.init_rope(96)
    prompt, width = MIXED[1], 64
    padded = KVCache(model.config, 3, 96, torch.device("cpu"), torch.float32)
    single = KVCache(model.config, 3, 96, torch.device("cpu"), torch.float32)
    for buffer in (*padded.k, *padded.v):
        buffer.fill_(7.0)
    with torch.inference_mode():
        logits = model(
            torch.tensor([prompt + [11] * (width - len(prompt))]),
            torch.arange(width).unsqueeze(0),
            padded.k,
            padded.v,
            torch.tensor([2]),
            kv_len=width,
            lengths=torch.tensor([len(prompt)]),
            fresh=True,
        )
        reference = model(
            torch.tensor([prompt]),
            torch.arange(len(prompt)).unsqueeze(0),
            single.k,
            single.v,
            slice(2, 3),
            len(prompt),
        )
    assert (logits - reference).abs().max() <= 1e-4
    for ours, theirs in zip((*padded.k, *padded.v), (*single.k, *single.v)):
        assert (ours[2, :, : len(prompt)] - theirs[2, :, : len(prompt)]).abs().max() <= 1e-4
        assert torch.all(ours[2, :, len(prompt) :] == 7.0), "padding wrote the cache"
        assert torch.all(ours[:2] == 7.0), "another slot was written"


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_prefill_and_key_length_buckets_give_the_same_tokens(model, params):
    """Prompts up to 32 tokens go one at a time through padded buckets, longer ones batched and eager;
    decode reads 16, 32, 64 or all 96 cached positions as the longest sequence grows."""
    bucketed = make_engine(
        model, max_batch_size=6, prefill_lengths=[8, 16, 32], kv_lengths=[16, 32, 64]
    ).generate(MIXED, params)
    assert bucketed == make_engine(model, max_batch_size=6).generate(MIXED, params)
    assert bucketed == [alone(model, p, params) for p in MIXED]


@pytest.mark.slow
def test_compiled_layers_and_head_give_the_eager_tokens(model):
    """torch.compile (inductor, CPU here): one compiled layer for all layers, the key length dynamic."""
    compiled = make_engine(model, compile=True, kv_lengths=[16, 32, 64])
    prompts = [MIXED[0], MIXED[2], MIXED[4]]
    assert compiled.generate(prompts, SAMPLED) == make_engine(model).generate(prompts, SAMPLED)


@pytest.mark.slow
def test_compiled_prefill_buckets_give_the_eager_tokens(model):
    """The padded prefill's layers compiled (one compiled layer, static for the first bucket it meets, its
    prompt length dynamic after): prompts of 2-6 tokens pad to 8, of 40 and 45 to 48."""
    buckets = {"max_batch_size": 6, "prefill_lengths": [8, 16, 48], "kv_lengths": [16, 32, 64]}
    compiled = make_engine(model, compile=True, **buckets)
    runner, layers = compiled.runner, []
    prefill_layer = runner.prefill_layer_fn
    assert prefill_layer is not decoder_layer
    runner.prefill_layer_fn = lambda *args: layers.append(args[2].shape[1]) or prefill_layer(*args)
    eager = make_engine(model, **buckets)
    assert eager.runner.prefill_layer_fn is decoder_layer
    assert compiled.generate(MIXED, SAMPLED) == eager.generate(MIXED, SAMPLED)
    assert set(layers) == {8, 48}
    uncompiled_prefill = make_engine(model, compile=True, compile_prefill=False, **buckets)
    assert uncompiled_prefill.runner.prefill_layer_fn is decoder_layer


NO_TOP_K = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=77)


def test_candidate_count_follows_the_running_requests(model):
    runner = make_engine(model).runner
    assert runner.candidate_counts == [64, VOCAB]
    assert runner.candidates([]) == runner.candidates([GREEDY]) == runner.candidates([GREEDY, SAMPLED]) == 64
    assert runner.candidates([SAMPLED, NO_TOP_K]) == VOCAB
    assert runner.candidates([SamplingParams(top_k=65)]) == VOCAB
    narrow = LLMEngine.from_model(model, max_batch_size=2, max_seq_len=96, max_top_k=32).runner
    assert narrow.candidate_counts == [32] and narrow.candidates([NO_TOP_K]) == 32
    with pytest.raises(ValueError, match="candidates must be one of"):
        runner.decode(1, candidates=100)


def recorded_candidates(engine: LLMEngine) -> list[int | None]:
    counts, decode = [], engine.runner.decode

    def recording(n, kv_len=None, candidates=None):
        counts.append(candidates)
        return decode(n, kv_len, candidates)

    engine.runner.decode = recording
    return counts


def test_steps_with_every_candidate_sample_what_steps_with_few_do(model):
    """SAMPLED alone runs 64-candidate steps; next to a request without top-k its steps take the vocabulary."""
    engine = make_engine(model)
    counts = recorded_candidates(engine)
    mixed = engine.generate([PROMPTS[0], PROMPTS[1]], [SAMPLED, NO_TOP_K])
    assert mixed[0] == alone(model, PROMPTS[0], SAMPLED)
    assert mixed[1] == alone(model, PROMPTS[1], NO_TOP_K)
    assert VOCAB in counts
    engine = make_engine(model)
    counts = recorded_candidates(engine)
    assert engine.generate([PROMPTS[0]], SAMPLED) == mixed[:1]
    assert set(counts) == {64}
