# each result appended as it happens, so a run cut by a timeout still counts
import gc
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


# --dry: FA3's tests on the CPU (fattn's CPU engine), to exercise the argument plumbing of fattn's entry
# points without a GPU.  FA3's file is not edited: its import-time capability query answers sm_90, and the
# constant "cuda" in the code of the collected test functions (their `device = "cuda"`) becomes "cpu", in
# memory only.  Refusals and asserts then are the CPU engine's; what the CUDA engine refuses needs a GPU run.
def pytest_addoption(parser):
    parser.addoption("--dry", action="store_true", help="run FA3's tests on the CPU (fattn's CPU engine)")


def pytest_configure(config):
    if config.getoption("--dry"):
        import torch
        torch.cuda.get_device_capability = lambda *a, **kw: (9, 0)


def _on_cpu(code):
    consts = tuple(_on_cpu(c) if hasattr(c, "co_consts") else "cpu" if c == "cuda" else c for c in code.co_consts)
    return code.replace(co_consts=consts)


# FA3T_SELECT: a Python expression over a case's parameters (with torch), keeping only those cases
def pytest_collection_modifyitems(config, items):
    if config.getoption("--dry"):
        for fn in {id(it.function): it.function for it in items if hasattr(it, "function")}.values():
            fn.__code__ = _on_cpu(fn.__code__)
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


# fattn's NotImplementedError raised outside the shim's calls (a backward through torch.autograd.grad): a
# refusal, counted as the shim counts the others, not a failure
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    e = call.excinfo.value if call.when == "call" and call.excinfo is not None else None
    if isinstance(e, NotImplementedError) and "fattn" in str(e):
        import flash_attn_interface
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0,
                        "Skipped: " + flash_attn_interface.refusal(e, " (outside the wrapped calls)"))


@pytest.fixture(autouse=True)
def _reset_served():
    import flash_attn_interface
    flash_attn_interface.OK[0] = 0
    yield


# Device memory of earlier cases: a skipped (or failed) case's tensors stay alive after it, in a reference
# cycle through the exception pytest caught (its traceback holds the test's frame), until Python's collector
# runs (checked: with gc off, a skipped test's tensor outlives it, a passed test's does not).  The collector
# runs on object counts, not device bytes: the likely cause of the 135 GiB that ~30,000 skipped cases left on
# the H200 (2026-12-03).  So: a full collection when more than FA3T_GC_GIB (8) GiB is still allocated after a case,
# and one every FA3T_GC_EVERY (500) cases whatever the device (host memory, --dry runs).
_GC_BYTES = float(os.environ.get("FA3T_GC_GIB", "8")) * 2 ** 30
_GC_EVERY = int(os.environ.get("FA3T_GC_EVERY", "500"))
_cases = [0]


def pytest_runtest_teardown(item, nextitem):
    import torch
    _cases[0] += 1
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if _cases[0] % _GC_EVERY == 0 or (cuda and torch.cuda.memory_allocated() > _GC_BYTES):
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
