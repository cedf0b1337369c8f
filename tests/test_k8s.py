"""deploy/k8s without a cluster: every overlay rendered with kustomize, validated against the Kubernetes schema,
checked against run.sh's defaults and the project's own command lines; the metric names of the autoscaler rule
and the dashboard read from a live tritonserver; the Job script and run.sh's --disagg_start run here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from k8s_manifests import (
    K8S,
    OVERLAYS,
    ROOT,
    Manifests,
    flag_value,
    kustomize_command,
    labels_match,
    metric_selectors,
    named_ports,
    regex_matchers,
    render_overlay,
    run_sh_choices,
    run_sh_defaults,
    run_sh_line,
)
from spark_models import build_spark_models
from waiting import wait_until

from tritontts.triton.bundle import TritonInstall
from tritontts.triton.disaggregated.plan import CHAT_PATH, LLMServerPlan, split_args
from tritontts.triton.server import ServerConfig, TritonServer

TRITON_MODELS = [build_spark_models]
GPU_OVERLAYS = ("single", "disaggregated")
CPU_OVERLAYS = ("cpu-demo",)
LLM_SERVER_MODULE = "tritontts.llm.openai_server"
API_MODULE = "tritontts.openai_api"
CUSTOM_RESOURCE_GROUPS = ("monitoring.coreos.com",)
ADAPTER_CONFIG = K8S / "base" / "prometheus-adapter-config.yaml"
DASHBOARD = K8S / "base" / "grafana-dashboard.json"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
FIRST_RESPONSE_SINCE = (2, 52)  # after 2.51 (24.10), which lacks it; from Triton core PR #396 (Oct 2024)

needs_kustomize = pytest.mark.skipif(
    kustomize_command() is None, reason="neither kubectl nor kustomize is installed: cannot render deploy/k8s"
)


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> str:
    return request.param


@pytest.fixture
def manifests(overlay) -> Manifests:
    if kustomize_command() is None:
        pytest.skip("neither kubectl nor kustomize is installed: cannot render deploy/k8s")
    return render_overlay(overlay)


def the_one(items: list, what: str):
    assert len(items) == 1, f"expected one {what}, found {len(items)}"
    return items[0]


def api_container(manifests: Manifests):
    return the_one(list(manifests.containers_running(API_MODULE)), "speech API container")


def llm_servers(manifests: Manifests):
    """Our OpenAI-compatible LLM server or trtllm-serve (disaggregated only)."""
    return [*manifests.containers_running(LLM_SERVER_MODULE), *manifests.containers_running("trtllm-serve")]


def job_script(manifests: Manifests) -> str:
    job = the_one(manifests.workloads("Job"), "Job")
    container = the_one(job.containers, "Job container")
    assert container["command"] == ["bash", "-c"]
    return container["args"][0]


def test_the_overlays_are_the_three_of_issue_18():
    assert set(OVERLAYS) == {*GPU_OVERLAYS, *CPU_OVERLAYS}


def test_overlay_renders_into_one_namespace(manifests):
    kinds = {o["kind"] for o in manifests.objects}
    assert {"Namespace", "Deployment", "Service", "Job", "PersistentVolumeClaim", "ConfigMap"} <= kinds
    assert {"HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"} <= kinds
    namespace = the_one(manifests.of_kind("Namespace"), "Namespace")["metadata"]["name"]
    for obj in manifests.objects:
        assert obj["apiVersion"] and obj["metadata"]["name"]
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == namespace, obj["metadata"]["name"]


def test_every_object_validates_strictly(manifests):
    """Built-in kinds against the newest schema kubernetes-validate ships; the Prometheus Operator's PodMonitor,
    a CRD it has no schema for, by the checks of check_pod_monitor."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    checked, errors = 0, []
    for obj in manifests.objects:
        if obj["apiVersion"].split("/")[0] in CUSTOM_RESOURCE_GROUPS:
            check_pod_monitor(obj, manifests)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{obj['kind']} {obj['metadata']['name']}: {err.message} at {list(err.path)}")
        checked += 1
    assert not errors, f"Kubernetes {version}: " + "; ".join(errors)
    assert checked == len(manifests.objects) - len(manifests.of_kind("PodMonitor"))


POD_MONITOR_ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}


def check_pod_monitor(obj: dict, manifests: Manifests) -> None:
    """The fields monitoring.coreos.com/v1 PodMonitor requires, and that it scrapes the Triton metrics port."""
    assert (obj["apiVersion"], obj["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    spec = obj["spec"]
    assert set(spec) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}
    selected = [
        w for w, _ in manifests.tritonservers() if labels_match(spec["selector"]["matchLabels"], w.pod_labels)
    ]
    assert selected, "the PodMonitor selects no Triton pod"
    assert spec["podMetricsEndpoints"]
    for endpoint in spec["podMetricsEndpoints"]:
        assert set(endpoint) <= POD_MONITOR_ENDPOINT_FIELDS and isinstance(endpoint["port"], str)
        assert endpoint["path"] == "/metrics"
        for workload in selected:
            ports = {n: p for c in workload.containers for n, p in named_ports(c).items()}
            assert ports[endpoint["port"]] == int(run_sh_defaults()["metrics_port"])


def test_ports_equal_run_sh_defaults(manifests):
    defaults = {k: int(v) for k, v in run_sh_defaults().items() if k.endswith("_port")}
    expected = {
        "http": defaults["http_port"],
        "grpc": defaults["grpc_port"],
        "metrics": defaults["metrics_port"],
    }
    servers = manifests.tritonservers()
    assert servers
    for workload, container in servers:
        argv = manifests.argv(container)
        assert named_ports(container) == expected
        for name, port in expected.items():
            assert flag_value(argv, f"--{name}-port") == str(port)
        annotations = workload.obj["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(defaults["metrics_port"])
        assert annotations["prometheus.io/scrape"] == "true"
        service = the_one(manifests.services_for(workload), f"Service of {workload.name}")
        for port in expected.values():
            assert manifests.service_port(service, port, workload) == port
    workload, container = api_container(manifests)
    argv = manifests.argv(container)
    assert named_ports(container) == {"http": defaults["api_port"]}
    assert flag_value(argv, "--port") == str(defaults["api_port"])
    triton_service = the_one(manifests.services_for(servers[0][0]), "Triton Service")["metadata"]["name"]
    assert flag_value(argv, "--triton-url") == f"{triton_service}:{defaults['grpc_port']}"
    for _, container in llm_servers(manifests):
        assert named_ports(container) == {"http": defaults["llm_port"]}
        assert flag_value(manifests.argv(container), "--port") == str(defaults["llm_port"])


def startup_budget(probe: dict) -> int:
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def test_probes(manifests, overlay):
    server_timeout = int(run_sh_defaults()["server_timeout"])
    for _, container in manifests.tritonservers():
        probes = {kind: container[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
        paths = {kind: (p["httpGet"]["path"], p["httpGet"]["port"]) for kind, p in probes.items()}
        assert paths == {
            "startup": ("/v2/health/ready", "http"),
            "readiness": ("/v2/health/ready", "http"),
            "liveness": ("/v2/health/live", "http"),
        }
        # at least as long as run.sh stage 3 waits for a model load (10 minutes)
        assert startup_budget(probes["startup"]) >= server_timeout
        if overlay in GPU_OVERLAYS:
            assert startup_budget(probes["startup"]) >= 900
    _, api = api_container(manifests)
    assert api["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "tcpSocket" in api["livenessProbe"]  # a Triton outage makes the API unready, never restarts it
    for _, llm in llm_servers(manifests):
        assert llm["startupProbe"]["httpGet"]["path"] == "/health"
        assert startup_budget(llm["startupProbe"]) >= server_timeout


def gpus(container: dict) -> tuple[str | None, str | None]:
    resources = container.get("resources", {})
    return (
        resources.get("requests", {}).get("nvidia.com/gpu"),
        resources.get("limits", {}).get("nvidia.com/gpu"),
    )


def test_gpu_requests(manifests, overlay):
    if overlay in CPU_OVERLAYS:
        assert "nvidia.com/gpu" not in manifests.text()
        return
    for _, container in [*manifests.tritonservers(), *llm_servers(manifests)]:
        assert gpus(container) == ("1", "1")
    assert gpus(api_container(manifests)[1]) == (None, None)
    job = the_one(manifests.workloads("Job"), "Job")
    assert gpus(job.containers[0]) == ("1", "1")  # trtllm-build and its smoke test


def test_shm_is_memory_backed_in_every_triton_container(manifests):
    for workload, container in manifests.tritonservers():
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        empty_dir = workload.volume(mount["name"])["emptyDir"]
        assert empty_dir["medium"] == "Memory" and empty_dir["sizeLimit"]


def test_tritonserver_runs_with_run_sh_flags_and_histograms(manifests):
    """The python-backend flags that run.sh's servers get (tritontts.triton.server), the repository the Job
    prepared, and the first-response histogram."""
    reference = TritonServer(
        ServerConfig(model_repo=Path("/repo")), TritonInstall(Path("tritonserver"), "PATH")
    )
    backend_flags = [a for a in reference.command() if a.startswith("--backend-config=")]
    assert backend_flags
    for _, container in manifests.tritonservers():
        argv = manifests.argv(container)
        assert argv[0] == "tritonserver"
        assert [a for a in argv if a.startswith("--backend-config=")] == backend_flags
        assert flag_value(argv, "--model-repository") == manifests.settings["MODEL_REPOSITORY"]
        assert flag_value(argv, "--metrics-config") == "histogram_latencies=true"


def test_graceful_shutdown_outlasts_running_streams(manifests):
    for workload in manifests.workloads("Deployment"):
        for container in workload.containers:
            command = container["lifecycle"]["preStop"]["exec"]["command"]
            assert command[0] == "sleep"
            exit_timeout = int(flag_value(manifests.argv(container), "--exit-timeout-secs") or 0)
            assert workload.pod["terminationGracePeriodSeconds"] > int(command[1]) + exit_timeout


def test_every_deployment_has_a_disruption_budget_and_a_service(manifests):
    for workload in manifests.workloads("Deployment"):
        labels = workload.pod_labels
        assert labels_match(workload.obj["spec"]["selector"]["matchLabels"], labels)
        budgets = [
            b
            for b in manifests.of_kind("PodDisruptionBudget")
            if labels_match(b["spec"]["selector"]["matchLabels"], labels)
        ]
        the_one(budgets, f"PodDisruptionBudget of {workload.name}")
        service = the_one(manifests.services_for(workload), f"Service of {workload.name}")
        container_ports = {p["name"] for c in workload.containers for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_models_are_prepared_once_and_served_read_only(manifests):
    job = the_one(manifests.workloads("Job"), "Job")
    claim = the_one(manifests.of_kind("PersistentVolumeClaim"), "PersistentVolumeClaim")["metadata"]["name"]
    (job_mount,) = [m for m in job.containers[0]["volumeMounts"] if m["mountPath"] == "/models"]
    assert job.volume(job_mount["name"])["persistentVolumeClaim"]["claimName"] == claim
    assert not job_mount.get("readOnly")
    (token,) = [e for e in job.containers[0]["env"] if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    assert 'touch "$MODEL_REPOSITORY.prepared"' in job_script(manifests)
    for workload, container in [*manifests.tritonservers(), *llm_servers(manifests)]:
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/models"]
        assert (
            mount["readOnly"]
            and workload.volume(mount["name"])["persistentVolumeClaim"]["claimName"] == claim
        )
        (wait,) = workload.init_containers
        assert '[ -e "$MODEL_REPOSITORY.prepared" ]' in wait["args"][0]
    _, api = api_container(manifests)
    (voices,) = [m for m in api["volumeMounts"] if m["mountPath"] == "/voices"]
    assert voices["subPath"] == "voices" and flag_value(manifests.argv(api), "--voices-dir") == "/voices"


def test_every_api_replica_writes_the_one_voices_folder(manifests):
    """Voices and their profiles, uploaded or deleted through any replica, are seen by every replica."""
    claim = the_one(manifests.of_kind("PersistentVolumeClaim"), "PersistentVolumeClaim")["metadata"]["name"]
    workload, api = api_container(manifests)
    (voices,) = [m for m in api["volumeMounts"] if m["mountPath"] == "/voices"]
    assert not voices.get("readOnly") and voices["subPath"] == "voices"
    assert workload.volume(voices["name"])["persistentVolumeClaim"]["claimName"] == claim


def test_servers_keep_their_compile_caches_on_the_models_volume(manifests):
    """A restarted tritonserver or LLM server pod finds the kernels torch.compile wrote before (run.sh
    --compile_cache_dir): both cache folders lie in a writable subPath of the models claim."""
    claim = the_one(manifests.of_kind("PersistentVolumeClaim"), "PersistentVolumeClaim")["metadata"]["name"]
    for workload, container in [*manifests.tritonservers(), *llm_servers(manifests)]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/compile-cache"]
        assert not mount.get("readOnly") and mount["subPath"] == "compile_cache"
        volume = workload.volume(mount["name"])["persistentVolumeClaim"]
        assert volume["claimName"] == claim and not volume.get("readOnly")
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/compile-cache/inductor"
        assert env["TRITON_CACHE_DIR"] == "/compile-cache/triton"


def test_servers_run_the_cuda_allocator_run_sh_gives_them(manifests):
    """Every tritonserver and LLM server pod has run.sh's --server_cuda_alloc_conf default in its environment."""
    default = run_sh_defaults()["server_cuda_alloc_conf"]
    assert default == "expandable_segments:True"
    for _, container in [*manifests.tritonservers(), *llm_servers(manifests)]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == default, container["name"]


def test_every_pod_runs_as_non_root(manifests):
    for workload in manifests.workloads():
        context = workload.pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        for container in workload.containers + workload.init_containers:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_one_image_the_one_dockerfile_server_builds(manifests):
    built = re.search(
        r"docker build -f Dockerfile\.server -t (\S+)", (ROOT / "Dockerfile.server").read_text()
    )
    images = {c["image"] for w in manifests.workloads() for c in w.containers + w.init_containers}
    assert images == {built.group(1)}


def test_autoscaler_reads_the_adapter_metric(manifests, overlay):
    adapter = yaml.safe_load(
        manifests.one("ConfigMap", "tritontts-prometheus-adapter")["data"]["config.yaml"]
    )
    assert adapter == yaml.safe_load(ADAPTER_CONFIG.read_text())
    rule_names = {rule["name"]["as"] for rule in adapter["rules"]}
    hpa = the_one(manifests.of_kind("HorizontalPodAutoscaler"), "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    servers = [
        w for w, _ in manifests.tritonservers() if (w.kind, w.name) == (target["kind"], target["name"])
    ]
    assert servers, "the autoscaler scales no Triton Deployment"
    assert "replicas" not in servers[0].obj["spec"]  # the autoscaler owns the count
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in rule_names
    average = float(metric["pods"]["target"]["averageValue"])
    assert run_sh_defaults()["bls_instance_num"] == "auto"  # 16 on a GPU host, else 4
    per_pod = 16 if overlay in GPU_OVERLAYS else 4
    assert per_pod / 2 < average < per_pod  # below what one pod runs at once, above half of it
    for rule in adapter["rules"]:
        for name, matchers in metric_selectors(rule["metricsQuery"]):
            bls_models = set(regex_matchers(matchers)["model"].split("|"))
            assert bls_models == set(run_sh_choices("model")), name  # every family's BLS, named as --model


def test_network_policy_lets_only_the_api_and_prometheus_reach_triton(manifests):
    policies = manifests.of_kind("NetworkPolicy")
    api_labels = api_container(manifests)[0].pod_labels
    for workload, _ in manifests.tritonservers():
        policy = the_one(
            [
                p
                for p in policies
                if labels_match(p["spec"]["podSelector"]["matchLabels"], workload.pod_labels)
            ],
            "NetworkPolicy of the Triton pods",
        )
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        ports_by_peer = {}
        for rule in policy["spec"]["ingress"]:
            (peer,) = rule["from"]
            ports = {p["port"] for p in rule["ports"]}
            if "namespaceSelector" in peer:
                ports_by_peer["prometheus"] = ports
            else:
                assert labels_match(peer["podSelector"]["matchLabels"], api_labels)
                ports_by_peer["api"] = ports
        assert ports_by_peer == {"api": {"http", "grpc"}, "prometheus": {"metrics"}}
    for workload, _ in llm_servers(manifests):
        policy = the_one(
            [
                p
                for p in policies
                if labels_match(p["spec"]["podSelector"]["matchLabels"], workload.pod_labels)
            ],
            "NetworkPolicy of the LLM pods",
        )
        (rule,) = policy["spec"]["ingress"]
        (peer,) = rule["from"]
        assert any(
            labels_match(peer["podSelector"]["matchLabels"], w.pod_labels)
            for w, _ in manifests.tritonservers()
        )


def test_grafana_dashboard_is_provisioned(manifests):
    config_map = manifests.one("ConfigMap", "tritontts-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (document,) = config_map["data"].values()
    dashboard = json.loads(document)
    assert dashboard == json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


@pytest.mark.parametrize("components", [(), ("trtllm-serve",)], ids=["ours", "trtllm-serve"])
def test_disaggregated_llm_server_runs_stage_7_command(components):
    """The LLM container runs what tritontts.triton.disaggregated.plan builds for run.sh stage 7's defaults."""
    if kustomize_command() is None:
        pytest.skip("neither kubectl nor kustomize is installed: cannot render deploy/k8s")
    manifests = render_overlay("disaggregated", components)
    defaults = run_sh_defaults()
    settings = manifests.settings
    workload, container = the_one(llm_servers(manifests), "LLM server")
    model_home = Path("/models") / settings["MODEL"]
    plan = LLMServerPlan(
        backend=settings["LLM_BACKEND"],
        model_dir=model_home / "checkpoint" / "cosyvoice2_llm",
        gpus=("0",),
        port=int(defaults["llm_port"]),
        address="0.0.0.0",
        engine_dir=model_home / f"trt_engines_{defaults['trt_dtype']}",
        max_batch_size=int(defaults["llm_server_max_batch_size"]),
        max_seq_len=int(defaults["llm_max_seq_len"]),
        device=defaults["llm_device"],
        dtype=defaults["llm_dtype"],
        cuda_graphs=defaults["llm_cuda_graphs"] == "true",
        compile=defaults["llm_compile"] == "true",
        kv_cache_free_gpu_memory_fraction=float(defaults["llm_server_kv_cache_fraction"]),
        command_prefix=split_args(defaults["trtllm_serve_prefix"]),
        python="python3",
    )
    assert manifests.argv(container) == plan.command()
    assert settings["LLM_BACKEND"] == ("trtllm" if components else "torch")


def test_disaggregated_bls_asks_the_llm_service():
    if kustomize_command() is None:
        pytest.skip("neither kubectl nor kustomize is installed: cannot render deploy/k8s")
    manifests = render_overlay("disaggregated")
    workload, container = the_one(llm_servers(manifests), "LLM server")
    service = the_one(manifests.services_for(workload), "LLM Service")
    port = manifests.service_port(service, int(run_sh_defaults()["llm_port"]), workload)
    script = job_script(manifests)
    endpoint = re.search(r"--llm_endpoint (\S+)", script).group(1)
    assert endpoint == f"http://{service['metadata']['name']}:{port}{CHAT_PATH}"
    assert "--disagg_start false" in script
    # the Job's stage 7 writes where the Triton pods serve from
    settings = manifests.settings
    line = run_sh_line("disagg_repo")
    shell = f'exp_dir=/models model={settings["MODEL"]} mode={settings["MODE"]}; model_home=$exp_dir/$model; {line}; echo "$disagg_repo"'
    written = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.strip()
    assert written == settings["MODEL_REPOSITORY"]


@pytest.mark.slow
def test_cpu_demo_job_script_prepares_what_the_servers_wait_for(tmp_path):
    """The cpu-demo Job's script, run here with /models in a temporary folder: checkpoint, repository, voice."""
    if kustomize_command() is None:
        pytest.skip("neither kubectl nor kustomize is installed: cannot render deploy/k8s")
    manifests = render_overlay("cpu-demo")
    models = str(tmp_path / "models")
    script = job_script(manifests).replace("/models", models)
    env = {k: v.replace("/models", models) for k, v in manifests.settings.items()}
    env["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # python3: this interpreter
    )
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    repository = Path(env["MODEL_REPOSITORY"])
    assert Path(f"{repository}.prepared").is_file()
    assert {p.name for p in repository.iterdir()} >= {
        "spark_tts",
        "audio_tokenizer",
        "vocoder",
        "tensorrt_llm",
    }
    config = (repository / "spark_tts" / "config.pbtxt").read_text()
    assert f'string_value: "{models}/spark_tts/checkpoint/LLM"' in config
    assert re.search(r'key: "max_new_tokens", value: \{ string_value: "100" \}', config)

    from tritontts.audio import AudioLimits
    from tritontts.openai_api.voices import VoiceStore

    voice = VoiceStore(Path(models) / "voices", AudioLimits(), 1000).get("default")
    assert voice.samples.size == 3 * 16000 and voice.transcript


def test_stage_7_writes_the_repository_only_with_disagg_start_false(tmp_path):
    endpoint = "http://tritontts-llm:8010/v1/chat/completions"
    (tmp_path / "checkpoint").mkdir()
    command = [
        "bash",
        "run.sh",
        "7",
        "7",
        "--model",
        "cosyvoice2",
        "--model_dir",
        str(tmp_path / "checkpoint"),
    ]
    command += ["--exp_dir", str(tmp_path), "--python", sys.executable, "--disagg_start", "false"]
    done = subprocess.run([*command, "--llm_endpoint", endpoint], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    config = (
        tmp_path / "cosyvoice2" / "model_repo_disagg_streaming" / "cosyvoice2" / "config.pbtxt"
    ).read_text()
    assert f'{{ key: "llm_endpoint", value: {{ string_value: "{endpoint}" }} }}' in config
    assert '{ key: "tensorrt_llm_model", value: { string_value: "none" } }' in config
    assert not (tmp_path / "cosyvoice2" / "disagg").exists()  # no state file: nothing started
    done = subprocess.run([*command[:-1], "maybe"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "--disagg_start must be true or false" in done.stderr


# The metric names of the autoscaler rule and the dashboard, on the session's live tritonserver


def referenced_selectors() -> list[tuple[str, str]]:
    """(metric, matchers) of every selector in the adapter rules and the dashboard's queries."""
    adapter = yaml.safe_load(ADAPTER_CONFIG.read_text())
    queries = [rule["metricsQuery"] for rule in adapter["rules"]] + [
        rule["seriesQuery"] for rule in adapter["rules"]
    ]
    dashboard = json.loads(DASHBOARD.read_text())
    queries += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries += [re.sub(r"label_values\((\w+),", r"\1{}", variable["definition"])]
    selectors = [s for query in queries for s in metric_selectors(query)]
    assert len({name for name, _ in selectors}) >= 8
    return selectors


@pytest.fixture(scope="module")
def live_metrics(triton) -> tuple[str, str]:
    """(/metrics text, server version) once the streaming BLS has served one request."""
    import tritonclient.http as httpclient
    from triton_stream import Stream

    server = triton.load("audio_tokenizer", "vocoder", "tensorrt_llm", "spark_tts")
    rate = 16000
    t = np.arange(2 * rate) / rate
    reference = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    arrays = {
        "reference_wav": reference.reshape(1, -1),
        "reference_wav_len": np.array([[reference.size]], dtype=np.int32),
        "reference_text": np.array([[b"A reference."]], dtype=object),
        "target_text": np.array([[b"One streamed sentence."]], dtype=object),
    }
    url = f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"

    def scrape() -> tuple[str, float]:
        text = urllib.request.urlopen(url, timeout=30).read().decode()
        counts = re.findall(r'^nv_inference_count\{[^}]*model="spark_tts"[^}]*\} (\S+)$', text, re.M)
        return text, sum(float(c) for c in counts)

    _, before = scrape()
    result = Stream(server.grpc_url, "spark_tts", arrays, ["waveform"]).read()
    assert result.error is None and result.outputs
    client = httpclient.InferenceServerClient(server.http_url)
    version = client.get_server_metadata()["version"]
    client.close()
    text, _ = wait_until(  # Triton counts the request once it has released it, after the final response
        scrape,
        lambda scraped: scraped[1] >= before + 1,
        f'nv_inference_count{{model="spark_tts"}} + 1 on {url}',
    )
    return text, version


def exposition(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str]]]]:
    """Families ({name: type}) and samples ([(name, labels)]) of a Prometheus text exposition."""
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = []
    for name, labels in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? \S+", text, re.M):
        samples.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels or ""))))
    return families, samples


def family_of(name: str, families: dict[str, str]) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and families.get(name.removesuffix(suffix)) == "histogram":
            return name.removesuffix(suffix)
    return name


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


def expected_absent(name: str, version: str, families: dict[str, str]) -> str | None:
    """Why a metric the manifests use cannot be on this server, or None when it must be there."""
    if name.startswith("nv_gpu_") and not any(f.startswith("nv_gpu_") for f in families):
        return "GPU metrics: this server sees no GPU"
    if (
        name.startswith("nv_inference_first_response_histogram")
        and version_tuple(version) < FIRST_RESPONSE_SINCE
    ):
        return f"nv_inference_first_response_histogram_ms: tritonserver {version} predates it (2.52)"
    return None


def test_metric_names_exist_on_a_live_tritonserver(live_metrics):
    """Every metric the adapter rule and the dashboard select is on the server's /metrics, and their label
    matchers (the BLS models) select its series; what this server cannot export is named, never silently passed."""
    text, version = live_metrics
    families, samples = exposition(text)
    live = {name for name, _ in samples}
    found, missing, excused = set(), set(), set()
    for name, matchers in referenced_selectors():
        if name in live:
            found.add(name)
            series = [labels for sample, labels in samples if sample == name]
            for label, pattern in regex_matchers(matchers).items():
                if label != "namespace":  # added by Prometheus when it scrapes
                    assert any(re.fullmatch(pattern, s.get(label, "")) for s in series), (
                        name,
                        label,
                        pattern,
                    )
        elif reason := expected_absent(name, version, families):
            excused.add(reason)
        else:
            missing.add(name)
    assert not missing, f"not on tritonserver {version}'s /metrics: {sorted(missing)}"
    assert any(n.startswith("tritontts_voice_cache_") for n in found) and any(
        n.startswith("nv_") for n in found
    )
    print(f"tritonserver {version}: {len(found)} metrics found; not checked here: {sorted(excused)}")


def test_first_response_histogram_on_a_live_tritonserver(live_metrics):
    text, version = live_metrics
    families, samples = exposition(text)
    name = "nv_inference_first_response_histogram_ms"
    assert f"{name}_bucket" in {n for n, _ in referenced_selectors()}  # the dashboard's first-chunk panel
    if version_tuple(version) < FIRST_RESPONSE_SINCE:
        assert name not in families  # so the skip below is about this server, not about the flag
        pytest.skip(
            f"tritonserver {version} has no {name} (it came after 2.51, with Triton core PR #396); "
            "NVIDIA's 25.06 image has it"
        )
    assert families[name] == "histogram"
    assert any(n == f"{name}_count" and labels.get("model") == "spark_tts" for n, labels in samples)


def test_server_flags_reach_the_session_server(triton):
    """The session server runs with the histogram flag deploy/k8s passes, so the test above sees what k8s sees."""
    assert "--metrics-config=histogram_latencies=true" in triton.server.command()
