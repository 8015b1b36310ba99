"""pytest settings of the Python tests (pytest is their one runner).

A test function may return a string: the reason it could not run here (no GPU, no torch), reported as a skip
with that reason rather than as a pass. Tests that need a usable GPU carry the marker `gpu` (`-m gpu` runs
them alone on a GPU machine; elsewhere they skip with the reason)."""
import inspect

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a usable NVIDIA GPU; skips with the reason where there is none")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    fn = pyfuncitem.obj
    args = {name: pyfuncitem.funcargs[name] for name in inspect.signature(fn).parameters
            if name in pyfuncitem.funcargs}
    reason = fn(**args)
    if isinstance(reason, str) and reason:
        pytest.skip(reason)
    return True
