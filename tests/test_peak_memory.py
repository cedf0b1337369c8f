"""tests/peak_memory.py in a pytest of its own: the test that allocates is named in the summary, with and without
xdist (whose workers send the gain to the controller in the report)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).parent
OPTIONS = ["-p", "no:cacheprovider"]

INNER = """
def test_allocates():
    block = bytearray(300 << 20)
    block[::4096] = b"x" * len(block[::4096])

def test_allocates_nothing():
    assert True
"""


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["alone", "xdist"])
def test_the_summary_names_the_test_that_raised_the_peak(tmp_path, workers):
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "TRITONTTS_TEST_PEAK_REPORT_MIB": "200"}
    inner = [sys.executable, "-m", "pytest", "-q", "-p", "peak_memory", *OPTIONS, *workers]
    # through a shell that forks it: a process forked from this test's keeps this one's peak as its own
    result = subprocess.run(
        ["sh", "-c", '"$@"; exit $?', "sh", *inner],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "peak memory by more than 200 MiB" in result.stdout, result.stdout
    summary = result.stdout.split("peak memory by more than 200 MiB", 1)[1]
    named = [line for line in summary.splitlines() if line.startswith("+")]
    assert len(named) == 1 and named[0].endswith("test_inner.py::test_allocates"), result.stdout
    assert 280 <= int(named[0].split()[0][1:]) <= 400, named[0]
