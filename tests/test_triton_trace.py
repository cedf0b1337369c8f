"""tritontts.bench.triton_trace on tritonserver's trace format: a trace's entries spread over a list and over the
numbered files of `triton,log-frequency`, a BLS's requests tied to the client request by `parent_id`. The trace of
a real tritonserver is read in tests/test_run_sh.py (run.sh --server_extra_args)."""

import json
import subprocess
import sys
from pathlib import Path

from tritontts.bench.triton_trace import read_traces, timelines, trace_files

ROOT = Path(__file__).resolve().parents[1]
MS = 1_000_000


def stamp(trace_id: int, name: str, ms: float) -> dict:
    return {"id": trace_id, "timestamps": [{"name": name, "ns": int(1e12 + ms * MS)}]}


def client_request(trace_id: int, request_id: str, queued_ms: float, sends_ms: list[float]) -> list[dict]:
    head = {"id": trace_id, "model_name": "bls", "model_version": 1, "request_id": request_id}
    entries = [head, stamp(trace_id, "REQUEST_START", 0), stamp(trace_id, "QUEUE_START", 0.1)]
    entries += [stamp(trace_id, "COMPUTE_START", 0.1 + queued_ms)]
    for ms in sends_ms:
        entries += [stamp(trace_id, "GRPC_SEND_START", ms), stamp(trace_id, "GRPC_SEND_END", ms + 0.2)]
    return entries + [
        stamp(trace_id, "COMPUTE_END", sends_ms[-1] + 1),
        stamp(trace_id, "REQUEST_END", sends_ms[-1] + 1),
    ]


def child_request(trace_id: int, parent: int, model: str, start_ms: float, end_ms: float) -> list[dict]:
    head = {"id": trace_id, "model_name": model, "model_version": 1, "parent_id": parent}
    return [
        head,
        stamp(trace_id, "REQUEST_START", start_ms),
        stamp(trace_id, "QUEUE_START", start_ms),
        stamp(trace_id, "COMPUTE_START", start_ms + 2),
        stamp(trace_id, "REQUEST_END", end_ms),
    ]


def write_parts(path: Path) -> None:
    slow = client_request(1, "slow", queued_ms=180.0, sends_ms=[250.0, 300.0])
    fast = client_request(2, "fast", queued_ms=0.0, sends_ms=[40.0, 90.0])
    children = child_request(3, 1, "token2wav", 190.0, 240.0) + child_request(4, 1, "token2wav", 260.0, 290.0)
    children += child_request(5, 1, "llm", 181.0, 182.0)
    Path(f"{path}.0").write_text(json.dumps(slow[:5] + fast + children[:3]))
    Path(f"{path}.1").write_text(json.dumps(slow[5:] + children[3:]))
    Path(f"{path}.summary").write_text("not a part")


def test_timelines_merge_parts_and_tie_children_to_their_client_request(tmp_path):
    trace = tmp_path / "trace.json"
    write_parts(trace)
    assert [p.name for p in trace_files(trace)] == ["trace.json.0", "trace.json.1"]
    slow, fast = timelines(read_traces(trace_files(trace)), "bls")
    assert (slow.request_id, fast.request_id) == ("slow", "fast")
    assert slow.queue_ms == 180.0 and (slow.first_response_ms, slow.last_response_ms) == (250.0, 300.0)
    assert fast.queue_ms == 0.0 and fast.first_response_ms == 40.0 and fast.children == []
    llm, token2wav = slow.children
    assert (llm.model, llm.requests, llm.start_ms, llm.end_ms, llm.queue_ms) == ("llm", 1, 181.0, 182.0, 2.0)
    assert (token2wav.requests, token2wav.start_ms, token2wav.end_ms, token2wav.queue_ms) == (
        2,
        190.0,
        290.0,
        4.0,
    )
    assert timelines(read_traces(trace_files(trace)), "token2wav") == []


def test_trace_summary_prints_the_slowest_first_and_names_a_missing_file(tmp_path):
    trace = tmp_path / "trace.json"
    write_parts(trace)
    command = [
        sys.executable,
        "scripts/trace_summary.py",
        str(trace),
        "--model",
        "bls",
        "--json",
        str(tmp_path / "t.json"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2 requests of bls in 2 file(s), slowest first response first:"
    assert lines[1].startswith("slow: queue 180.0, first response 250.0, last 300.0 ms | llm x1 181.0-182.0")
    assert [t["request_id"] for t in json.loads((tmp_path / "t.json").read_text())] == ["slow", "fast"]
    missing = subprocess.run(
        [*command[:2], str(tmp_path / "none.json"), "--model", "bls"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "no trace file at" in missing.stderr
