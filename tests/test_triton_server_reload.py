"""`scripts/triton_server.py reload`: a loaded model's string parameters changed in its config.pbtxt and the model
loaded again on a running tritonserver (explicit model control), the other models untouched."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TRITON_MODELS_DIR, echo, start_explicit_server

from tritontts.triton.reload import parse_settings, with_parameters

REPO_ROOT = Path(__file__).resolve().parents[1]
ECHO_CONFIG = (TRITON_MODELS_DIR / "infra_echo" / "config.pbtxt").read_text()


def test_only_the_named_parameters_change():
    text = with_parameters(ECHO_CONFIG, {"scale": "3.5"})
    assert '{ key: "scale", value: { string_value: "3.5" } }' in text
    assert text.replace('"3.5"', '"2.0"') == ECHO_CONFIG


def test_a_key_the_config_lacks_is_refused_with_the_keys_it_has():
    with pytest.raises(ValueError, match=r"no parameter scal in this config; it has: scale, upper"):
        with_parameters(ECHO_CONFIG, {"scal": "3"})
    with pytest.raises(ValueError, match="must not hold quotes"):
        with_parameters(ECHO_CONFIG, {"scale": '3" } }'})


def test_settings_are_key_equals_value():
    assert parse_settings(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in ("a", "=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_settings([bad])


def test_reload_serves_the_new_parameter_and_a_refused_or_failed_one_leaves_the_model_as_it_was(tmp_path):
    repo = tmp_path / "model_repo"
    shutil.copytree(
        TRITON_MODELS_DIR / "infra_echo", repo / "infra_echo", ignore=shutil.ignore_patterns("*.pyc")
    )
    server = start_explicit_server(repo, tmp_path / "tritonserver.log")
    cli = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "triton_server.py"),
        "reload",
        "--model-repo",
        str(repo),
    ]
    cli += ["--model", "infra_echo", "--http-port", str(server.config.http_port)]
    ones = np.ones(3, np.float32)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        client.load_model("infra_echo")
        client.close()
        np.testing.assert_array_equal(echo(server.http_url, ones), 2.0 * ones)

        done = subprocess.run([*cli, "--set", "scale=3.0"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "scale=3.0" in done.stdout and "upper=false" in done.stdout
        np.testing.assert_array_equal(echo(server.http_url, ones), 3.0 * ones)

        config = (repo / "infra_echo" / "config.pbtxt").read_text()
        refused = subprocess.run([*cli, "--set", "scal=4"], capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1 and "no parameter scal" in refused.stderr, refused.stderr
        assert (repo / "infra_echo" / "config.pbtxt").read_text() == config
        np.testing.assert_array_equal(echo(server.http_url, ones), 3.0 * ones)

        failed = subprocess.run([*cli, "--set", "scale=many"], capture_output=True, text=True, timeout=300)
        assert failed.returncode == 1 and "loading 'infra_echo' again failed" in failed.stderr, failed.stderr
        assert (repo / "infra_echo" / "config.pbtxt").read_text() == config
        np.testing.assert_array_equal(echo(server.http_url, ones), 3.0 * ones)
    finally:
        server.stop(grace_s=15)
