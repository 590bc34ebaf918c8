# each result appended as it happens, so a run cut by a timeout still counts
import os
import pytest
LOG = os.environ.get("FA3T_LOG", "fa3t-results.txt")
def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        reason = ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        elif report.outcome == "failed":
            reason = str(report.longrepr).splitlines()[-1][:200] if report.longrepr else ""
        with open(LOG, "a") as f:
            f.write("%s\t%s\t%s\n" % (report.outcome, report.nodeid, reason))


# FA3T_SELECT: a Python expression over a case's parameters (with torch), keeping only those cases
def pytest_collection_modifyitems(config, items):
    expr = os.environ.get("FA3T_SELECT")
    if not expr:
        return
    import torch
    keep, drop = [], []
    for it in items:
        params = getattr(getattr(it, "callspec", None), "params", {})
        (keep if eval(expr, {"torch": torch}, dict(params)) else drop).append(it)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


@pytest.fixture(autouse=True)
def _reset_served():
    import flash_attn_interface
    flash_attn_interface.OK[0] = 0
    yield
