"""The fuzz test's one check over all its cases: valid calls refused as unsupported stay rare.

Each case reports through `record_property` (the reports reach the controlling process under
pytest-xdist too); the controller prints the refusals and fails the session past the share.
"""

from __future__ import annotations

import pytest

LIMITATION_SHARE = 0.05  # of the valid calls run, at most this many may meet a stated limitation
_seen = {"valid": 0, "limitations": []}


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "fuzz_valid":
            _seen["valid"] += 1
        elif key == "fuzz_limitation":
            _seen["valid"] += 1
            _seen["limitations"].append(value)


def _too_many() -> bool:
    return len(_seen["limitations"]) > LIMITATION_SHARE * max(_seen["valid"], 1)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _seen["valid"]:
        return
    limitations = _seen["limitations"]
    terminalreporter.write_line(f"fuzz: {len(limitations)} of {_seen['valid']} valid calls met a stated limitation "
                                f"(at most {LIMITATION_SHARE:.0%} may)")
    for line in limitations:
        terminalreporter.write_line(f"  {line}")
    if _too_many():
        terminalreporter.write_line("fuzz: FAILED: too many valid calls refused as unsupported", red=True)


def pytest_sessionfinish(session, exitstatus):
    if not hasattr(session.config, "workerinput") and _too_many() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
