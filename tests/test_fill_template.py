"""scripts/fill_template.py: the upstream call form, errors that name the key, values with commas and colons."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fill_template.py"
TEMPLATE = """name: "m"
max_batch_size: ${triton_max_batch_size}
parameters [
  { key: "model_dir", value: { string_value: "${model_dir}" } },
  { key: "device", value: { string_value: "${device}" } }
]
instance_group [ { count: ${instance_num}, kind: KIND_CPU } ]
"""
ALL = "triton_max_batch_size:16,model_dir:/data/ckpt,device:cpu,instance_num:2"


def fill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "config.pbtxt"
    path.write_text(TEMPLATE)
    return path


def test_in_place_upstream_call_form(template):
    result = fill("-i", str(template), ALL)
    assert result.returncode == 0, result.stderr
    text = template.read_text()
    assert "max_batch_size: 16" in text and 'string_value: "/data/ckpt"' in text and "count: 2," in text
    assert "${" not in text


def test_output_file_leaves_template_alone(template, tmp_path):
    out = tmp_path / "filled" / "config.pbtxt"
    result = fill(str(template), ALL, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert template.read_text() == TEMPLATE
    assert "max_batch_size: 16" in out.read_text()


def test_stdout_without_target(template):
    result = fill(str(template), ALL)
    assert result.returncode == 0 and "count: 2," in result.stdout and template.read_text() == TEMPLATE


def test_unknown_key_is_an_error_naming_it(template):
    result = fill("-i", str(template), ALL + ",modle_dir:/x")
    assert result.returncode != 0 and "'modle_dir' is not a placeholder" in result.stderr
    assert template.read_text() == TEMPLATE


def test_unfilled_placeholders_are_an_error_unless_allowed(template, tmp_path):
    result = fill("-i", str(template), "triton_max_batch_size:16,device:cpu")
    assert result.returncode != 0 and "model_dir, instance_num" in result.stderr
    assert template.read_text() == TEMPLATE
    result = fill("-i", str(template), "triton_max_batch_size:16,device:cpu", "--allow-unfilled")
    assert result.returncode == 0
    assert "${model_dir}" in template.read_text() and "max_batch_size: 16" in template.read_text()


def test_values_with_colons_and_commas(template):
    result = fill(
        "-i",
        str(template),
        r"triton_max_batch_size:8,model_dir:/a\,b:c,device:cuda:0",
        "-s",
        "instance_num:1,2",
    )
    assert result.returncode == 0, result.stderr
    text = template.read_text()
    assert 'string_value: "/a,b:c"' in text and 'string_value: "cuda:0"' in text and "count: 1,2," in text


def test_pairs_as_separate_arguments_and_bad_pairs(template):
    assert (
        fill(
            "-i", str(template), "triton_max_batch_size:4", "model_dir:/m", "device:cpu,instance_num:1"
        ).returncode
        == 0
    )
    assert "max_batch_size: 4" in template.read_text()
    template.write_text(TEMPLATE)
    bad = fill("-i", str(template), "triton_max_batch_size=4")
    assert bad.returncode != 0 and "not a key:value pair" in bad.stderr
    twice = fill("-i", str(template), ALL, "device:cuda")
    assert twice.returncode != 0 and "'device' given twice" in twice.stderr


def test_missing_file(tmp_path):
    result = fill("-i", str(tmp_path / "nope.pbtxt"), "a:b")
    assert result.returncode != 0 and "nope.pbtxt" in result.stderr
