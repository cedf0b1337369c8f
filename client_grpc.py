#!/usr/bin/env python3
"""Benchmark (or try once) a TTS model served by Triton over gRPC, offline or streaming.

    python client_grpc.py --model-name spark_tts --mode streaming --num-tasks 4 \
        --huggingface-dataset yuekai/seed_tts --split-name wenetspeech4tts --log-dir exp/bench
    python client_grpc.py --mode offline --sweep 1,2,4,8,16 --huggingface-dataset exp/bench_data
    python client_grpc.py --reference-audio prompt.wav --reference-text "..." --target-text "..."
    python client_grpc.py --model-name cosyvoice2 --use-spk2info-cache true --target-text "..."
    python client_grpc.py --model-name cosyvoice2 --mode streaming --num-tasks 4 \
        --server-addrs localhost:18001,localhost:18002 --num-gpus 3   # disaggregated: token2wav servers

Each of `--num-tasks` workers is a thread with its own gRPC client that sends the next unsent row as soon as its
last request ends; `--num-requests N` cycles the rows to N requests, so that many streams stay in flight with any
dataset. Streaming requests go over a decoupled stream; the first-chunk latency is taken when the first
non-empty audio chunk arrives in the stream's callback. Writes summary.json, summary.md, latency.png and
one WAV per row into --log-dir. With --use-spk2info-cache true only target_text is sent, as upstream's client
does, and CosyVoice2 speaks as the cached speaker of its spk2info.pt; the dataset's prompts are not used.
With --server-addrs, worker i sends to server i mod n and the reports add a per-server table (requests,
first-chunk and whole latency by server).
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import soundfile

from tritontts.bench import triton_io
from tritontts.bench.dataset import DatasetError, Utterance, load_manifest, load_utterances
from tritontts.bench.durations import expected_tokens
from tritontts.bench.per_server import parse_servers, server_of_worker, server_rows, server_table
from tritontts.bench.report import markdown_table, write_report
from tritontts.bench.server_stages import (
    breakdown_line,
    first_chunk_breakdown,
    model_breakdown,
    model_breakdown_line,
    scrape,
)
from tritontts.bench.stats import BenchmarkRun, RequestRecord, summarize
from tritontts.streaming import crossfade_concat
from tritontts.voice_modes import add_mode_arguments, mode_arrays, mode_parameters

DEFAULT_PADDING_SECONDS = {"offline": 1.0, "streaming": 10.0}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-addr", default="localhost", help="Triton host")
    p.add_argument("--server-port", type=int, default=8001, help="Triton gRPC port")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="Triton metrics port of --server-addr: runs then report each model's requests, batching and mean "
        "times (Triton's counters), and streaming runs where first chunks spend their time (the BLS's and "
        "token2wav's stage metrics); 0: off",
    )
    p.add_argument(
        "--server-addrs",
        default=None,
        help="host:port,host:port: spread the workers round-robin over these gRPC servers (replaces "
        "--server-addr/--server-port)",
    )
    p.add_argument(
        "--num-gpus",
        type=int,
        default=None,
        help="GPUs of the deployment (LLM's included), for the per-server table's concurrent_tasks_per_gpu",
    )
    p.add_argument(
        "--model-name", default="spark_tts", help="Triton model to request (spark_tts, cosyvoice2)"
    )
    p.add_argument("--mode", choices=["offline", "streaming"], default="offline")
    p.add_argument("--num-tasks", type=int, default=1, help="concurrent requests (worker threads)")
    p.add_argument(
        "--sweep", default=None, help="comma-separated concurrencies run one after another, e.g. 1,2,4,8"
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=0,
        help="requests per concurrency, cycling the rows (row ids get a .N suffix from the second pass on), so "
        "that N streams stay in flight whatever the number of rows; 0: each row once",
    )
    p.add_argument("--log-dir", default="./tmp", help="where summaries, the plot and the WAVs go")
    p.add_argument(
        "--huggingface-dataset",
        default="yuekai/seed_tts",
        help="hub name, save_to_disk dir, parquet file or dir, or manifest",
    )
    p.add_argument("--split-name", default="wenetspeech4tts", help="dataset split")
    p.add_argument(
        "--manifest-path",
        default=None,
        help="upstream manifest: id|prompt_text|prompt_wav|target_text per line",
    )
    p.add_argument("--reference-audio", default=None, help="single-utterance mode: the prompt WAV")
    p.add_argument("--reference-text", default="", help="single-utterance mode: the prompt's transcript")
    p.add_argument("--target-text", default="", help="single-utterance mode: the text to speak")
    p.add_argument(
        "--chunk-overlap-duration",
        type=float,
        default=None,
        help="seconds consecutive streamed chunks overlap (default by model: 0.1 spark_tts, 0 cosyvoice2)",
    )
    p.add_argument(
        "--use-spk2info-cache",
        type=triton_io.true_or_false,
        default=False,
        help="true: send target_text only (CosyVoice2's cached speaker speaks); no reference audio needed",
    )
    p.add_argument("--sample-rate", type=int, default=None, help="output sample rate; default by model name")
    p.add_argument(
        "--realistic-lengths",
        action="store_true",
        help="ask for exactly 50 (spark_tts) or 25 (cosyvoice2) tokens per second of each target text's expected "
        "duration (request parameters min_new_tokens/max_new_tokens): for checkpoints that may not stop by "
        "themselves, such as synthetic ones",
    )
    p.add_argument(
        "--padding-duration",
        type=float,
        default=None,
        help="pad reference audio to a multiple of this many seconds (default: 1 offline, 10 streaming; 0: none)",
    )
    p.add_argument(
        "--request-timeout", type=float, default=300.0, help="seconds to wait for any one response"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="send the first N rows once, one at a time, to every server before measuring; not counted",
    )
    p.add_argument(
        "--log-interval", type=int, default=5, help="kept for upstream compatibility (tqdm shows progress)"
    )
    p.add_argument(
        "--compute-wer", action="store_true", help="not supported; accepted for upstream compatibility"
    )
    add_mode_arguments(p)
    return p


def cycled(items: Sequence[Utterance], count: int) -> list[Utterance]:
    """`count` requests over the rows in order, again and again; pass k >= 1 renames row ids to `id.k`."""
    if count <= 0:
        return list(items)
    out = []
    for i in range(count):
        utt, rank = items[i % len(items)], i // len(items)
        out.append(utt if rank == 0 else dataclasses.replace(utt, id=f"{utt.id}.{rank}"))
    return out


def single_utterance(args: argparse.Namespace) -> bool:
    """One request from the command line: a reference audio, or the cached speaker and a target text."""
    return bool(args.reference_audio or (args.use_spk2info_cache and args.target_text))


def load_items(args: argparse.Namespace) -> list[Utterance]:
    if args.reference_audio:
        wav, rate = soundfile.read(args.reference_audio, dtype="float32", always_2d=True)
        return [Utterance("test", args.reference_text, wav[:, 0], int(rate), args.target_text)]
    if single_utterance(args):
        silent = np.zeros(0, dtype=np.float32)
        return [Utterance("test", "", silent, triton_io.REFERENCE_SAMPLE_RATE, args.target_text)]
    if args.manifest_path:
        return load_manifest(args.manifest_path)
    return load_utterances(args.huggingface_dataset, args.split_name)


def request_arrays(args: argparse.Namespace, utt: Utterance) -> dict:
    """A row's input arrays: the reference resampled to 16 kHz and padded (`--padding-duration`), the texts."""
    if args.use_spk2info_cache or args.gender:
        arrays = triton_io.target_only_arrays(utt.target_text)
    else:
        padding = (
            DEFAULT_PADDING_SECONDS[args.mode] if args.padding_duration is None else args.padding_duration
        )
        samples = triton_io.reference_samples(utt.prompt_audio, utt.sample_rate)
        arrays = triton_io.request_arrays(samples, utt.prompt_text, utt.target_text, padding)
    return mode_arrays(args, arrays)


class Requester:
    """Sends requests over one gRPC client; one per worker thread."""

    def __init__(
        self, args: argparse.Namespace, output_rate: int, server: str, prepared: dict | None = None
    ) -> None:
        """`prepared`: input arrays by row id, made before the run (`request_arrays`); others are made per request."""
        import tritonclient.grpc as grpcclient

        self.grpc = grpcclient
        self.args = args
        self.prepared = prepared
        self.output_rate = output_rate
        self.client = grpcclient.InferenceServerClient(url=server)
        self.token_rate = triton_io.token_rate(args.model_name)
        overlap = triton_io.chunk_overlap_seconds(args.model_name, args.chunk_overlap_duration)
        self.overlap = int(round(overlap * output_rate))

    def close(self) -> None:
        self.client.close()

    def _parameters(self, utt: Utterance) -> dict | None:
        parameters = mode_parameters(self.args)
        if self.args.realistic_lengths:
            tokens = expected_tokens(utt.target_text, self.token_rate)
            parameters |= {"min_new_tokens": tokens, "max_new_tokens": tokens}
        return parameters or None

    def _inputs(self, utt: Utterance) -> list:
        arrays = self.prepared.get(utt.id) if self.prepared is not None else None
        return triton_io.infer_inputs(
            self.grpc, arrays if arrays is not None else request_arrays(self.args, utt)
        )

    def offline(self, utt: Utterance) -> tuple[np.ndarray, RequestRecord]:
        inputs, outputs = self._inputs(utt), triton_io.requested_outputs(self.grpc)
        start = time.perf_counter()
        result = self.client.infer(
            self.args.model_name,
            inputs,
            outputs=outputs,
            request_id=uuid.uuid4().hex,
            client_timeout=self.args.request_timeout,
            parameters=self._parameters(utt),
        )
        latency = time.perf_counter() - start
        audio = triton_io.waveform(result)
        return audio, RequestRecord(utt.id, latency, audio.size / self.output_rate, chunks=1)

    def streaming(self, utt: Utterance) -> tuple[np.ndarray, RequestRecord]:
        inputs, outputs = self._inputs(utt), triton_io.requested_outputs(self.grpc)
        responses: queue.Queue = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: responses.put((time.perf_counter(), result, error))
        )
        chunks: list[np.ndarray] = []
        first_chunk = None
        try:
            start = time.perf_counter()
            self.client.async_stream_infer(
                self.args.model_name,
                inputs,
                outputs=outputs,
                request_id=uuid.uuid4().hex,
                enable_empty_final_response=True,
                parameters=self._parameters(utt),
            )
            while True:
                try:
                    arrived, result, error = responses.get(timeout=self.args.request_timeout)
                except queue.Empty:
                    raise TimeoutError(f"no response within {self.args.request_timeout} s") from None
                if error is not None:
                    raise RuntimeError(str(error))
                chunk = triton_io.waveform(result)
                if chunk.size:
                    first_chunk = arrived - start if first_chunk is None else first_chunk
                    chunks.append(chunk)
                if triton_io.is_final(result):
                    latency = arrived - start
                    break
        finally:
            self.client.stop_stream()
        audio = crossfade_concat(chunks, self.overlap)
        return audio, RequestRecord(utt.id, latency, audio.size / self.output_rate, first_chunk, len(chunks))


def servers(args: argparse.Namespace) -> list[str]:
    if args.server_addrs:
        return parse_servers(args.server_addrs)
    return [f"{args.server_addr}:{args.server_port}"]


def run_benchmark(
    args: argparse.Namespace,
    items: Sequence[Utterance],
    concurrency: int,
    wav_dir: Path,
    record_servers: dict[str, str] | None = None,
) -> BenchmarkRun:
    """Sends every item once with `concurrency` workers, worker i to server i mod n; each worker takes the next
    unsent item as soon as its last one ends, so `concurrency` requests stay in flight until the items run out.
    Failed requests are recorded, not raised. `record_servers` (when given) gets each request's server by its id."""
    from tqdm import tqdm

    output_rate = triton_io.output_sample_rate(args.model_name, args.sample_rate)
    wav_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(concurrency, len(items)))
    records: list[RequestRecord] = []
    lock = threading.Lock()
    progress = tqdm(
        total=len(items),
        desc=f"{args.mode} x{workers}",
        unit="req",
        file=sys.stderr,
        disable=len(items) == 1,
    )

    targets = servers(args)
    # each row's inputs (its reference resampled to 16 kHz) are made before the clock starts: the run times the
    # server; a row sent again (--num-requests) shares its first pass's arrays
    prepared: dict[str, dict] = {}
    made: dict[tuple, dict] = {}
    for utt in items:
        same_inputs = (id(utt.prompt_audio), utt.prompt_text, utt.target_text)
        try:
            if same_inputs not in made:
                made[same_inputs] = request_arrays(args, utt)
        except Exception:  # noqa: BLE001 - that row's request makes its inputs again and records the error
            continue
        prepared[utt.id] = made[same_inputs]
    pending = iter(items)

    def next_item() -> Utterance | None:
        with lock:
            return next(pending, None)

    def work(worker: int) -> None:
        server = server_of_worker(targets, worker)
        requester = Requester(args, output_rate, server, prepared)
        send = requester.streaming if args.mode == "streaming" else requester.offline
        try:
            while (utt := next_item()) is not None:
                try:
                    audio, record = send(utt)
                    soundfile.write(wav_dir / f"{utt.id}.wav", audio, output_rate, subtype="PCM_16")
                except Exception as error:
                    message = (
                        str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    )
                    record = RequestRecord(utt.id, 0.0, error=message)
                    progress.write(f"request {utt.id} failed: {message}", file=sys.stderr)
                with lock:
                    records.append(record)
                    if record_servers is not None:
                        record_servers[utt.id] = server
                    progress.update(1)
        finally:
            requester.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(work, i) for i in range(workers)]:
            future.result()
    wall = time.perf_counter() - start
    progress.close()
    order = {utt.id: i for i, utt in enumerate(items)}
    records.sort(key=lambda r: order.get(r.id, len(order)))
    return BenchmarkRun(args.mode, workers, wall, records)


def stage_metrics_url(args: argparse.Namespace) -> str | None:
    """Where to read the metrics: runs against one server with --metrics-port set."""
    if args.metrics_port <= 0 or args.server_addrs:
        return None
    return f"http://{args.server_addr}:{args.metrics_port}/metrics"


def concurrencies(args: argparse.Namespace) -> list[int]:
    if not args.sweep:
        return [args.num_tasks]
    values = [int(v) for v in args.sweep.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"--sweep needs positive integers, got '{args.sweep}'")
    return values


def check_server(args: argparse.Namespace) -> None:
    import tritonclient.grpc as grpcclient

    for url in servers(args):
        client = grpcclient.InferenceServerClient(url=url)
        try:
            triton_io.check_server(client, url, "gRPC", args.model_name, streaming=args.mode == "streaming")
        finally:
            client.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        levels = concurrencies(args)
        if args.num_requests < 0:
            raise ValueError(f"--num-requests must be 0 (each row once) or more, got {args.num_requests}")
        check_server(args)
        output_rate = triton_io.output_sample_rate(args.model_name, args.sample_rate)
        items = load_items(args)
    except (triton_io.ServerCheckError, DatasetError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not items:
        print("error: the dataset has no rows", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir)

    if single_utterance(args):
        run = run_benchmark(args, items, 1, log_dir)
        record = run.records[0]
        if not record.ok:
            print(f"error: request failed: {record.error}", file=sys.stderr)
            return 1
        first = (
            ""
            if record.first_chunk_latency is None
            else f", first chunk {record.first_chunk_latency * 1000:.1f} ms"
        )
        print(
            f"wrote {log_dir / 'test.wav'}: {record.audio_seconds:.2f} s of audio at {output_rate} Hz, "
            f"latency {record.latency * 1000:.1f} ms{first}, RTF {record.rtf:.4f}"
        )
        return 0

    targets = servers(args)
    if args.warmup > 0:
        # one worker per server, each sending the first N rows one at a time
        warm_items = list(items[: args.warmup]) * len(targets)
        warm = run_benchmark(args, warm_items, len(targets), log_dir / "warmup")
        failed = [r.error for r in warm.records if not r.ok]
        if failed:
            print(f"error: a warm-up request failed: {failed[0]}", file=sys.stderr)
            return 1
    runs, per_server, stages = [], [], []
    metrics_url = stage_metrics_url(args)
    for level in levels:
        wav_dir = log_dir if len(levels) == 1 else log_dir / f"concurrency_{level}"
        record_servers: dict[str, str] = {}
        before = scrape(metrics_url) if metrics_url else None
        runs.append(run_benchmark(args, cycled(items, args.num_requests), level, wav_dir, record_servers))
        if before is not None:
            after = scrape(metrics_url)
            entry = {"concurrency": runs[-1].concurrency, "models": model_breakdown(before, after)}
            print(
                f"concurrency {entry['concurrency']}: {model_breakdown_line(entry['models'])}",
                file=sys.stderr,
            )
            if args.mode == "streaming":
                first_chunk = summarize(runs[-1]).first_chunk_latency
                client_ms = None if first_chunk is None else first_chunk.avg * 1000.0
                entry.update(first_chunk_breakdown(before, after, client_ms))
                if entry.get("bls") or entry.get("token2wav_first_chunk"):
                    print(f"concurrency {entry['concurrency']}: {breakdown_line(entry)}", file=sys.stderr)
            stages.append(entry)
        rows = server_rows(runs[-1], record_servers, targets, args.num_gpus)
        per_server.append({"concurrency": runs[-1].concurrency, "servers": rows})
    metadata = {
        "model_name": args.model_name,
        "server": ",".join(targets),
        "protocol": "grpc",
        "dataset": args.manifest_path or args.huggingface_dataset,
        "split": None if args.manifest_path else args.split_name,
        "rows": len(items),
        "output_sample_rate": output_rate,
        "chunk_overlap_duration": triton_io.chunk_overlap_seconds(
            args.model_name, args.chunk_overlap_duration
        ),
        "use_spk2info_cache": args.use_spk2info_cache,
        "realistic_lengths_token_rate": triton_io.token_rate(args.model_name)
        if args.realistic_lengths
        else None,
        "warmup_requests": args.warmup,
        "requests_per_concurrency": args.num_requests or len(items),
    }
    if args.server_addrs:
        metadata["per_server"] = per_server
    if stages:
        metadata["server_stages"] = stages
    paths = write_report(runs, log_dir, metadata)
    print(markdown_table(runs), end="")
    if args.server_addrs:
        tables = "".join(
            f"\nconcurrency {entry['concurrency']}:\n\n" + server_table(entry["servers"])
            for entry in per_server
        )
        with open(paths["markdown"], "a", encoding="utf-8") as markdown:
            markdown.write("\n## By server\n" + tables)
        print(tables, end="")
    if stages:
        with open(paths["markdown"], "a", encoding="utf-8") as markdown:
            markdown.write("\n## Server stages (means, server metrics)\n\n")
            for s in stages:
                markdown.write(f"- concurrency {s['concurrency']}: {model_breakdown_line(s['models'])}\n")
                if s.get("bls") or s.get("token2wav_first_chunk"):
                    markdown.write(f"- concurrency {s['concurrency']}: {breakdown_line(s)}\n")
    print(f"wrote {paths['json']}, {paths['markdown']}, {paths['plot']}")
    failed = sum(not r.ok for run in runs for r in run.records)
    if failed:
        print(f"error: {failed} request(s) failed; see 'errors' in {paths['json']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
