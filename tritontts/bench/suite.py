"""The benchmark suite (run.sh stage 11): every headline figure of one GPU host, part by part.

Parts, in the order they run:

- `engine`: scripts/bench_llm.py, our engine's decode against bench_llm_reference.py and transformers;
- `flow_graphs`, `dit_flow_graphs`, `vocoder_graphs` (group `token2wav_graphs`): the token2wav graph scripts
  (CosyVoice2's flow, the DiT flow, CosyVoice2's HiFT and CosyVoice3's causal HiFT);
- `<family>:<mode>` for each family and mode (group `serving`): `bash run.sh 0 3` serves it, `bash run.sh 4 4`
  sweeps every concurrency through that one server, `bash run.sh stop` ends it.

Each part writes its schema JSON (`tritontts/bench/results.py`) into the output folder and a done marker under
`<exp_dir>/suite/` (`tritontts/bench/suite_state.py`); a later run skips the parts done with the same settings
unless forced, redoes failed and interrupted ones, and a failed part does not stop the others.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tritontts.bench import results, suite_rows, suite_websocket
from tritontts.bench.suite_config import (  # noqa: F401 (the suite's names, for scripts/gpu_suite.py and tests)
    ALL_PARTS,
    FAMILIES,
    FAMILY_NAMES,
    GPU_SERVE_ARGS,
    GROUPS,
    HIDDEN_OPTIONS,
    MODES,
    REPO,
    SCRIPT_PARTS,
    SCRIPT_WHAT,
    SERVING_PARTS,
    STOP_TIMEOUT_S,
    Device,
    SuiteConfig,
    detect_commit,
    detect_device,
    select_parts,
    shown_command,
    source_label,
)
from tritontts.bench.suite_state import PartStatus, SuiteState, render_status

EAGER_MAX_STREAMS = 4
"""flow_graphs on a GPU: the eager side of the lockstep streams up to 4 (16 eager streams take a minute)"""
ENGINE_MAX_SEQ_LEN = 1024
"""engine on a GPU: its 300 + 500 tokens fit, so 3 key-length buckets are captured per batch size, not 5"""
SERVED_FLOW_BATCH_SIZES = "1,2,4,8"
"""flow_graphs captures the batch sizes run.sh serves with (`--token2wav_graph_batch_sizes`): 16 streams go in
two batches of 8, as in a served token2wav"""


class PartFailed(Exception):
    pass


class Runner:
    """Runs the selected parts one after another; see the module's doc."""

    def __init__(self, config: SuiteConfig, device: Device | None = None, echo: Callable = print) -> None:
        self.config = config
        self.device = device or detect_device(config.device)
        self.state = SuiteState(config.exp_dir)
        self.echo = echo
        self.commit = detect_commit() if config.commit == "auto" else config.commit

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def command(self, argv: list[str], log: Path, deadline: float, commands: list[str]) -> None:
        """argv from the repository root in its own process group, its output appended to `log`; the group
        is killed at `deadline`. PartFailed when it exits non-zero or runs out of time."""
        shown = shown_command(argv, self.config.python)
        commands.append(shown)
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"\n$ {shlex.join(argv)}\n")
            out.flush()
            process = subprocess.Popen(
                argv, cwd=REPO, env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(process)
                raise PartFailed(f"timed out (--part-timeout {self.config.part_timeout_s:.0f} s)") from None
            except BaseException:
                self.kill(process)
                raise
        if rc != 0:
            raise PartFailed(f"exit {rc}: {shown}")

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def run_sh(self, *args: str) -> list[str]:
        c = self.config
        http, grpc, metrics = c.ports
        common = ["--exp_dir", str(c.exp_dir), "--python", c.python]
        common += ["--http_port", str(http), "--grpc_port", str(grpc), "--metrics_port", str(metrics)]
        return ["bash", "run.sh", *args, *common]

    def python_script(self, script: str, *args: str) -> list[str]:
        return [self.config.python, f"scripts/{script}", *args]

    def script_part(self, part: str, folder: Path, deadline: float, commands: list[str]) -> tuple[dict, list]:
        raw_path = folder / "raw.json"
        raw_path.unlink(missing_ok=True)
        cuda = self.device.kind == "cuda"
        tiny = self.config.model_source == "synthetic-tiny"
        reps = str(self.config.reps)
        log = folder / "log"
        if part == "engine":
            args = ["--device", "cuda" if cuda else "cpu", "--reference", "--output", str(raw_path)]
            if cuda:
                args += ["--compile", "--batch-sizes", "1,4,16,64,128", "--hf-batch-sizes", "1"]
                args += ["--hf-gen-len", "100", "--max-seq-len", str(ENGINE_MAX_SEQ_LEN)]
            else:
                args += ["--batch-sizes", "1,4", "--hf-batch-sizes", "1", "--hf-gen-len", "16"]
            argv = self.python_script("bench_llm.py", *args, *(["--tiny"] if tiny else []))
        else:  # the graph scripts: on the CPU a dry check (padded calls, no capture)
            args = ["--reps", reps, "--out", str(raw_path)]
            if not cuda:
                args += ["--device", "cpu", *(["--streams", "1"] if part == "flow_graphs" else [])]
            elif part == "flow_graphs":
                args += ["--eager-max-streams", str(EAGER_MAX_STREAMS)]
                args += ["--graph-batch-sizes", SERVED_FLOW_BATCH_SIZES]
            args += ["--preset", "tiny"] if tiny else []
            argv = self.python_script(f"bench_{part}.py", *args)
        self.command(argv, log, deadline, commands)
        raw = json.loads(raw_path.read_text(encoding="utf-8"))
        convert = {
            "engine": suite_rows.engine_rows,
            "flow_graphs": suite_rows.flow_graphs_rows,
            "dit_flow_graphs": suite_rows.dit_flow_graphs_rows,
            "vocoder_graphs": suite_rows.vocoder_graphs_rows,
        }[part]
        return raw, convert(raw)

    def serving_part(
        self, part: str, folder: Path, deadline: float, commands: list[str]
    ) -> tuple[dict, list]:
        c = self.config
        family, mode = part.split(":")
        model = ["--model", family]
        bench_dir = c.exp_dir / family / f"suite_log_{mode}"
        serve = self.config.serving_args(self.device)
        log = folder / "log"
        stop = self.run_sh("stop", *model)
        self.command(stop, log, time.monotonic() + STOP_TIMEOUT_S, [])  # a server a killed run left behind
        try:
            source = ["--model_source", c.model_source, "--llm_backend", c.llm_backend]
            served = "streaming" if mode == "websocket" else mode
            self.command(self.run_sh("0", "3", served, *model, *source, *serve), log, deadline, commands)
            if mode == "websocket":
                return self.websocket_benches(family, folder, deadline, commands)
            bench = ["--realistic_lengths", "true", "--warmup", str(c.warmup), "--sweep", c.sweep]
            bench += ["--log_dir", str(bench_dir), "--split_name", c.split_name]
            bench += ["--dataset", c.dataset] if c.dataset else []
            (bench_dir / "summary.json").unlink(missing_ok=True)
            self.command(self.run_sh("4", "4", mode, *model, *bench), log, deadline, commands)
        finally:
            try:
                self.command(stop, log, time.monotonic() + STOP_TIMEOUT_S, [])
            except PartFailed as error:
                self.echo(f"{part}: run.sh stop failed ({error}); see {log}")
            server_log = c.exp_dir / family / "tritonserver.log"  # where its start spent its time
            if server_log.is_file():
                (folder / "server.log").write_bytes(server_log.read_bytes())
        summary = json.loads((bench_dir / "summary.json").read_text(encoding="utf-8"))
        for name in ("summary.json", "summary.md"):
            (folder / name).write_bytes((bench_dir / name).read_bytes())
        return summary, suite_rows.serving_rows(summary, family, suite_rows.serving_layout(serve, family))

    def websocket_benches(
        self, family: str, folder: Path, deadline: float, commands: list[str]
    ) -> tuple[dict, list]:
        """The speech API (run.sh stage 6, in its own process group) before the running server, then every
        bench_ws_ttfa.py run of the family; the API is ended before returning."""
        c = self.config
        voices = c.exp_dir / family / "suite_voices"
        api = self.run_sh("6", "6", "--model", family, "--api_model_name", family)
        api += ["--api_port", str(c.api_port), "--voices_dir", str(voices)]
        commands.append(shown_command(api, c.python) + " &")
        with open(folder / "api.log", "a", encoding="utf-8") as out:
            process = subprocess.Popen(
                api, cwd=REPO, env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait = min(deadline, time.monotonic() + suite_websocket.HEALTH_WAIT_S)
            problem = suite_websocket.wait_healthy(c.api_port, wait, lambda: process.poll() is None)
            if problem:
                raise PartFailed(f"{problem}; see {folder / 'api.log'}")
            outputs = {}
            for label, options in suite_websocket.bench_runs(family):
                outputs[label] = folder / f"ws_{label}.json"
                argv = suite_websocket.bench_argv(
                    c.python, family, c.api_port, c.sweep, outputs[label], [*options, "--commit", self.commit]
                )
                self.command(argv, folder / "log", deadline, commands)
        finally:
            self.kill(process)
        return suite_websocket.websocket_rows(outputs)

    def what(self, part: str) -> str:
        if part in SCRIPT_WHAT:
            return f"{SCRIPT_WHAT[part]}, run.sh stage 11 part {part}."
        family, mode = part.split(":")
        c = self.config
        if mode == "websocket":
            return (
                f"{FAMILY_NAMES[family]} over the speech WebSocket (run.sh stage 6 before its streaming server): time "
                f"to first audio after the first text delta, text written at 20 words a second, at "
                f"c={c.sweep.replace(',', ', ')} ({suite_websocket.ROUNDS} rounds each), {suite_websocket.runs_described(family)}; "
                f"checkpoint {c.model_source}, run.sh stage 11 part {part}."
            )
        return (
            f"{FAMILY_NAMES[family]} {mode} through one tritonserver at c={c.sweep.replace(',', ', ')} (forced "
            f"realistic lengths, {c.warmup} warm-up rows), checkpoint {c.model_source}, run.sh stage 11 part {part}."
        )

    def result_name(self, part: str) -> str:
        return f"suite_{part.replace(':', '_')}_{self.device.label}_{source_label(self.config.model_source)}.json"

    def document(
        self, part: str, raw: dict, headline: list[dict], commands: list[str], seconds: float
    ) -> dict:
        device = self.device.name
        if self.device.machine_gpus > 1:
            device += f" (one of the machine's {self.device.machine_gpus})"
        meta = {
            "device": device,
            "gpu_count": int(self.device.kind == "cuda"),
            "date": datetime.date.today().isoformat(),
            "commit": self.commit,
            "command": commands,
            "what": self.what(part),
        }
        suite = {
            "part": part,
            "seconds": round(seconds, 1),
            "settings": self.config.settings(part, self.device),
        }
        return {"meta": meta, "headline": headline, "suite": suite, "raw": raw}

    def statuses(self) -> list[PartStatus]:
        return [self.state.status(p, self.config.settings(p, self.device)) for p in self.config.parts]

    def write_status(self) -> None:
        self.state.status_file.parent.mkdir(parents=True, exist_ok=True)
        self.state.status_file.write_text(render_status(self.state, self.statuses(), 20), encoding="utf-8")

    def run_part(self, part: str) -> bool:
        folder = self.state.start(part)
        self.write_status()
        start = time.monotonic()
        deadline = start + self.config.part_timeout_s
        commands: list[str] = []
        self.echo(f"{part}: started ({self.device.kind}); log {folder / 'log'}")
        try:
            if part in SCRIPT_PARTS:
                raw, headline = self.script_part(part, folder, deadline, commands)
            else:
                raw, headline = self.serving_part(part, folder, deadline, commands)
            if not headline:
                raise PartFailed("no headline figure in its output")
            data = self.document(part, raw, headline, commands, time.monotonic() - start)
            problems = results.validate(data, part)
            if problems:
                raise PartFailed("; ".join(str(p) for p in problems))
            text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
            (folder / "result.json").write_text(text, encoding="utf-8")
            self.config.out_dir.mkdir(parents=True, exist_ok=True)
            out = self.config.out_dir / self.result_name(part)
            out.write_text(text, encoding="utf-8")
        except (PartFailed, OSError, ValueError, KeyError, TypeError) as error:
            reason = str(error) if isinstance(error, PartFailed) else f"{type(error).__name__}: {error}"
            seconds = time.monotonic() - start
            with open(folder / "log", "a", encoding="utf-8") as log:
                log.write(f"\nsuite: part {part} failed: {reason}\n")
            self.state.finish(part, False, {"reason": reason, "seconds": round(seconds, 1)})
            self.echo(f"{part}: FAILED after {seconds:.0f} s: {reason}")
            self.write_status()
            return False
        seconds = time.monotonic() - start
        info = {"settings": self.config.settings(part, self.device), "seconds": round(seconds, 1)}
        self.state.finish(part, True, info | {"result": str(out)})
        self.echo(f"{part}: done in {seconds:.0f} s: {out}")
        self.write_results()
        self.write_status()
        return True

    def write_results(self) -> None:
        """RESULTS.md of the output folder, as `python scripts/benchmark_results.py --write` writes it."""
        argv = [
            sys.executable,
            "scripts/benchmark_results.py",
            "--write",
            "--benchmarks",
            str(self.config.out_dir),
        ]
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()
            self.echo(f"{results.RESULTS_NAME} not regenerated: " + "; ".join(lines[:5]))

    def run(self) -> int:
        """Every selected part not done yet (all with `force`); 0 when all are done, 1 when one failed."""
        self.echo(
            f"suite: parts {', '.join(self.config.parts)} on {self.device.name} ({self.device.kind}), "
            f"commit {self.commit}, into {self.config.out_dir}"
        )
        failed = []
        for part in self.config.parts:
            if not self.config.force and self.state.is_done(part, self.config.settings(part, self.device)):
                self.echo(f"{part}: done already, skipped (--force to run it again)")
                continue
            if not self.run_part(part):
                failed.append(part)
        self.write_status()
        self.echo(render_status(self.state, self.statuses(), 20))
        return 1 if failed else 0
