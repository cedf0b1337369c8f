"""Streams cancelled mid-stream must leave no memory in the Spark-TTS BLS stubs.

A BLS that stops reading a decoupled call (its client cancelled) must still read that call's responses to the
final one: tritonserver 2.51's stub (python_backend r24.10) has no `cancel()` on the response iterator, so the
`tensorrt_llm` model goes on to its max tokens, and every response it sends to the abandoned iterator stays in
the BLS stub's shared-memory pool and heap (tritontts.triton.bls.stream_model). Measured on the 2-core CI machine
(40 streams, each cancelled after its first chunk, 4 at a time, after 6 such streams of warm-up; 2026-11-26):
before the fix, in each of 5 runs, at least one stub's pool grew 4 -> 6 MiB (RssShmem +3.3 to +6.7 MiB) and every
stub's RssAnon grew 11.7 to 14.6 MiB (about 0.3 MiB per stream); after it no pool grew, RssAnon grew 3.3 to 5.4 MiB, and as much
(3.7 MiB) over 80 streams: one-time growth, not per stream. ANON_BOUND_MIB (8) sits between the two.

The BLS keeps each stream's call for HOLD_S (20 s, tritontts.triton.stub_objects) after it ends, so a pool and a
heap reach the peak of what 20 s of streams hold, and keep that size: the faster the streams, the higher the
peak (Spark-TTS with the engine's output window: streams 4 times faster, pools 4 -> 6 MiB and RssAnon +13 MiB
over 40 streams after a 6-stream warm-up, the same over 80 and 160, and back to the same allocated bytes once
the hold expired: no leak). The warm-up therefore runs for longer than HOLD_S (WARMUP_S), so that the
measurement compares two states at that peak and only growth per stream remains. That peak still moves with the
host's speed: on a busy CI host (2026-11-29, after the fix) one stub's pool grew 4 -> 6 MiB over the 40 streams
while its RssAnon grew 0.2 MiB, the measured streams having run faster than the warm-up's. So a pool may grow
by one step (GROWTH_BYTES, a higher peak of held calls), and RssAnon is the per-stream test: the leak cost 0.3 MiB
a stream, 12 MiB over 40.

The module serves the suite's Spark-TTS models on a server of its own whose python-backend pools are small
(POOL_BYTES, growing by GROWTH_BYTES), so that shared memory held by cancelled requests shows as a pool that
grows (`shm_pool_bytes`) within a few dozen streams instead of hiding in the default 64 MiB.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import build_repository, start_with_server_threads
from leftover_stubs import kill_leftover_stubs
from reliability_models import (
    LLM_STREAM,
    SPARK_STREAM,
    TOKENIZER,
    VOCODER,
    build_reliability_models,
    knob,
    read_outcome,
    record,
    reference_fixture,
    resident_parts,
    shm_pool_bytes,
    spark_arrays,
    wait_engine_idle,
)
from triton_stream import Stream
from waiting import scaled

from tritontts.triton.bls import stream_model
from tritontts.triton.server import ServerConfig, TritonServer, free_ports
from tritontts.triton.stub_objects import HOLD_S

POOL_BYTES = 4 * 2**20
GROWTH_BYTES = 2 * 2**20
WARMUP_S = HOLD_S + 5
CANCELLED = int(knob("cancelled_streams", 40))
AT_ONCE = 4
ANON_BOUND_MIB = 8.0


reference = reference_fixture()


@pytest.fixture(scope="module")
def small_pool_server(tmp_path_factory):
    """The suite's streaming Spark-TTS models (rel_spark_tts and what it calls) on small python-backend pools."""
    root = tmp_path_factory.mktemp("cancel_leak")
    repo = root / "model_repo"
    build_repository([build_reliability_models], repo, root / "data")
    http_port, grpc_port, metrics_port = free_ports(3)
    config = ServerConfig(
        model_repo=repo,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_file=root / "tritonserver.log",
        model_control_mode="explicit",
        exit_timeout_s=5,
        python_shm_bytes=POOL_BYTES,
        python_shm_growth_bytes=GROWTH_BYTES,
        extra_args=tuple(f"--load-model={m}" for m in (TOKENIZER, VOCODER, LLM_STREAM, SPARK_STREAM)),
    )
    server = TritonServer(config)
    start_with_server_threads(server)
    try:
        server.wait_ready(timeout=scaled(180))
        yield server
    finally:
        server.stop(grace_s=15)
        kill_leftover_stubs(repo)


def cancel_after_first_chunk(server, arrays) -> None:
    stream = Stream(server.grpc_url, SPARK_STREAM, arrays, ["waveform"])
    stream.read(limit=1, timeout=120)
    stream.cancel()


def cancel_streams(server, arrays, count: int) -> None:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        list(pool.map(lambda _: cancel_after_first_chunk(server, arrays), range(count)))
    settle(server)


def settle(server) -> None:
    time.sleep(1)
    wait_engine_idle(server, LLM_STREAM, timeout=60)  # the cancelled calls' LLM work is over
    time.sleep(1)


def warm_up(server, arrays, seconds: float) -> None:
    """Cancelled streams, AT_ONCE at a time as measured, until `seconds` have passed: the hold window's peak."""
    ends = time.monotonic() + seconds

    def stream_until_the_end(_) -> None:
        while time.monotonic() < ends:
            cancel_after_first_chunk(server, arrays)

    with ThreadPoolExecutor(AT_ONCE) as pool:
        list(pool.map(stream_until_the_end, range(AT_ONCE)))
    settle(server)


def bls_stubs(figures: dict) -> dict:
    return {name: value for name, value in figures.items() if name.startswith(SPARK_STREAM + "_")}


@pytest.mark.reliability
def test_cancelled_streams_leave_no_memory_in_the_bls_stubs(small_pool_server, reference):
    server = small_pool_server
    arrays = spark_arrays(reference)
    warm_up(server, arrays, WARMUP_S)
    pools_before, parts_before = bls_stubs(shm_pool_bytes(server.pid)), bls_stubs(resident_parts(server.pid))
    started = time.monotonic()
    cancel_streams(server, arrays, CANCELLED)
    took = time.monotonic() - started
    pools_after, parts_after = bls_stubs(shm_pool_bytes(server.pid)), bls_stubs(resident_parts(server.pid))
    figures = {
        name: {
            "pool_mib": [pools.get(name, 0) / 2**20 for pools in (pools_before, pools_after)],
            "anon_mib": [round(parts[name]["anon"] / 2**20, 1) for parts in (parts_before, parts_after)],
            "shmem_mib": [round(parts[name]["shmem"] / 2**20, 1) for parts in (parts_before, parts_after)],
        }
        for name in parts_before
        if name in parts_after
    }
    record("cancelled_streams_bls_memory", cancelled=CANCELLED, seconds=round(took, 1), stubs=figures)
    print(f"{CANCELLED} cancelled streams in {took:.1f} s: {figures}")
    assert read_outcome(Stream(server.grpc_url, SPARK_STREAM, arrays, ["waveform"]), 120)[0] == "ok"
    assert len(figures) == 2, figures  # both instances of rel_spark_tts
    for name, fig in figures.items():
        assert fig["pool_mib"][1] - fig["pool_mib"][0] <= GROWTH_BYTES / 2**20, (name, fig)
        assert fig["anon_mib"][1] - fig["anon_mib"][0] <= ANON_BOUND_MIB, (name, fig)


# --- the same in plain Python: what stream_model does with a call it stops reading ------------------------------


class FakeResponse:
    def has_error(self) -> bool:
        return False


class FakeResponses:
    """A decoupled call's response iterator as 2.51's stub has it: no cancel()."""

    def __init__(self, count: int) -> None:
        self.left = count

    def __iter__(self):
        return self

    def __next__(self):
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        return FakeResponse()


class FakeCancellableResponses(FakeResponses):
    """r24.11 on: cancel() makes the callee end the stream early."""

    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.left = min(self.left, 1)  # the final response still comes


@pytest.mark.parametrize("responses", [FakeResponses(10), FakeCancellableResponses(10)])
def test_a_call_closed_early_is_read_to_its_final_response(monkeypatch, responses):
    class Request:
        def exec(self, decoupled):
            assert decoupled
            return responses

    class PbUtils:
        @staticmethod
        def get_output_tensor_by_name(response, name):
            return response

    monkeypatch.setattr("tritontts.triton.bls._request", lambda *args: Request())
    monkeypatch.setattr("tritontts.triton.bls._outputs", lambda pb, model, response, outputs: {"x": 1})
    monkeypatch.setattr("tritontts.triton.bls.hold_until_stub_done", lambda obj: None)
    outputs = stream_model(PbUtils, "llm", {}, ["x"], decoupled=True)
    assert next(outputs) == {"x": 1}
    outputs.close()
    assert responses.left == 0
    assert getattr(responses, "cancelled", True)
