"""pytest for the script-style tests: a test function that returns a reason string is reported as skipped
with that reason (as the scripts' own runner does), not as passed."""
import inspect

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    fn = pyfuncitem.obj
    args = {name: pyfuncitem.funcargs[name] for name in inspect.signature(fn).parameters
            if name in pyfuncitem.funcargs}
    reason = fn(**args)
    if isinstance(reason, str) and reason:
        pytest.skip(reason)
    return True
