"""Rendering deploy/k8s with kustomize and reading the result: objects, pods, containers, run.sh's defaults."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
RUN_SH = ROOT / "run.sh"
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kustomize_command() -> list[str] | None:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


@functools.cache
def _render(directory: str) -> tuple[dict, ...]:
    command = kustomize_command()
    assert command is not None, "no kubectl or kustomize"
    done = subprocess.run([*command, directory], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)} {directory} failed:\n{done.stderr}"
    return tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)


def render_overlay(name: str, components: tuple[str, ...] = ()) -> Manifests:
    """`kubectl kustomize deploy/k8s/overlays/<name>`, with extra components through a kustomization of our own."""
    if not components:
        return Manifests(list(_render(str(K8S / "overlays" / name))))
    with tempfile.TemporaryDirectory() as tmp:
        relative = os.path.relpath(K8S, tmp)
        spec = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"{relative}/overlays/{name}"],
            "components": [f"{relative}/components/{c}" for c in components],
        }
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(spec))
        return Manifests(list(_render(tmp)))


@functools.cache
def run_sh_defaults() -> dict[str, str]:
    """Every `name=value` option default above run.sh's usage(), as its --help prints them (quotes removed)."""
    defaults = {}
    for line in RUN_SH.read_text().split("\nusage() {", 1)[0].splitlines():
        match = re.match(r'^([a-z0-9_]+)=("[^"]*"|\S*)', line)
        if match:
            defaults[match.group(1)] = match.group(2).strip('"')
    return defaults


def run_sh_choices(variable: str) -> list[str]:
    """The values run.sh accepts for `$variable`, from its `case "$variable" in a|b|c)` check."""
    match = re.search(rf'^case "\${variable}" in ([\w|]+)\)', RUN_SH.read_text(), re.M)
    assert match, f"run.sh has no case check of ${variable}"
    return match.group(1).split("|")


def run_sh_line(variable: str) -> str:
    """run.sh's assignment of an internal variable, e.g. `disagg_repo=$model_home/model_repo_disagg_${mode}`."""
    match = re.search(rf"^{variable}=.*$", RUN_SH.read_text(), re.M)
    assert match, f"run.sh never assigns {variable}"
    return match.group(0)


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@dataclass
class Workload:
    obj: dict

    @property
    def kind(self) -> str:
        return self.obj["kind"]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def pod(self) -> dict:
        return self.obj["spec"]["template"]["spec"]

    @property
    def pod_labels(self) -> dict:
        return self.obj["spec"]["template"]["metadata"].get("labels", {})

    @property
    def containers(self) -> list[dict]:
        return self.pod["containers"]

    @property
    def init_containers(self) -> list[dict]:
        return self.pod.get("initContainers", [])

    def volume(self, name: str) -> dict:
        (volume,) = [v for v in self.pod.get("volumes", []) if v["name"] == name]
        return volume


class Manifests:
    def __init__(self, objects: list[dict]) -> None:
        self.objects = objects

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name_prefix: str) -> dict:
        (obj,) = [o for o in self.of_kind(kind) if o["metadata"]["name"].startswith(name_prefix)]
        return obj

    @property
    def settings(self) -> dict[str, str]:
        return self.one("ConfigMap", "tritontts-settings")["data"]

    def workloads(self, kind: str | None = None) -> list[Workload]:
        kinds = (kind,) if kind else ("Deployment", "Job")
        return [Workload(o) for o in self.objects if o["kind"] in kinds]

    def expand(self, text: str, container: dict | None = None) -> str:
        """Kubernetes' $(VAR) expansion with the settings ConfigMap (envFrom) and the container's own env."""
        env = dict(self.settings)
        for item in (container or {}).get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
        return _VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text)

    def argv(self, container: dict) -> list[str]:
        return [self.expand(a, container) for a in container.get("command", []) + container.get("args", [])]

    def containers_running(self, program: str) -> Iterator[tuple[Workload, dict]]:
        """(workload, container) for every main container whose argv runs `program` (a program or a module),
        directly or behind a launcher (`python3 -m`, `mpirun ...`)."""
        for workload in self.workloads():
            for container in workload.containers:
                if any(Path(arg).name == program for arg in self.argv(container)[:8]):
                    yield workload, container

    def tritonservers(self) -> list[tuple[Workload, dict]]:
        return list(self.containers_running("tritonserver"))

    def services_for(self, workload: Workload) -> list[dict]:
        return [
            s for s in self.of_kind("Service") if labels_match(s["spec"]["selector"], workload.pod_labels)
        ]

    def service_port(self, service: dict, container_port: int, workload: Workload) -> int:
        """The Service port that reaches `container_port` of the workload's pods (by name or number)."""
        names = {p.get("name"): p["containerPort"] for c in workload.containers for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if names.get(target, target) == container_port:
                return port["port"]
        raise AssertionError(f"Service {service['metadata']['name']} reaches no port {container_port}")

    def text(self) -> str:
        return json.dumps(self.objects)


def flag_value(argv: list[str], flag: str) -> str | None:
    """`--flag=value` or `--flag value` in an argv."""
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


def named_ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def metric_selectors(promql: str) -> list[tuple[str, str]]:
    """(metric name, label matchers) of every `name{...}` selector in a PromQL expression."""
    return re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", promql)


def regex_matchers(matchers: str) -> dict[str, str]:
    """`model=~"a|b"` and `model="a"` matchers of a selector as {label: regex}."""
    found = {}
    for label, op, value in re.findall(r'([a-zA-Z_]\w*)\s*(=~|=)\s*"([^"]*)"', matchers):
        found[label] = value if op == "=~" else re.escape(value)
    return found
