"""The tests that raised their process's peak resident memory by more than 1 GiB, listed at the end of the run.

A pytest-xdist worker that the kernel kills for memory leaves the run waiting for it, and no summary is printed; the
list of a finished run says which tests need the memory. Each test's gain is read from `ru_maxrss` (the process's
peak, in KiB on Linux) before its setup and after its teardown, and travels to xdist's controller in the report's
`user_properties`. A process keeps the peak of the one it was forked from, so a test run from a larger process
reports nothing until it passes that peak. TRITONTTS_TEST_PEAK_REPORT_MIB sets the threshold (1024).
"""

from __future__ import annotations

import os
import resource

import pytest

PROPERTY = "peak_rss_gain_mib"
REPORT_MIB = int(os.environ.get("TRITONTTS_TEST_PEAK_REPORT_MIB", "1024"))
PEAK_BEFORE = pytest.StashKey[float]()
GAINS: list[tuple[str, int]] = []  # (node id, MiB) of the reports seen by this process


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[PEAK_BEFORE] = peak_rss_mib()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and PEAK_BEFORE in item.stash:
        gain = peak_rss_mib() - item.stash[PEAK_BEFORE]
        if gain > REPORT_MIB:
            item.user_properties.append((PROPERTY, round(gain)))
    yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == PROPERTY:
            GAINS.append((report.nodeid, value))


def pytest_terminal_summary(terminalreporter) -> None:
    if not GAINS:
        return
    terminalreporter.section(f"tests that raised their process's peak memory by more than {REPORT_MIB} MiB")
    for nodeid, gain in sorted(GAINS, key=lambda g: -g[1]):
        terminalreporter.write_line(f"+{gain} MiB  {nodeid}")
