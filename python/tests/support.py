"""What the script-style test files share: importing gdskit (exit 77, a skip, when it is not built) and catching
the error a call raises."""
import os
import sys


def import_gdskit():
    """The gdskit package; exits with 77 (ctest's skip) when it cannot be imported."""
    try:
        import gdskit  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover
        print(f"SKIP: cannot import gdskit ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH")
        sys.exit(77)
    return gdskit


def optional(name):
    """The module `name`, or None when it is not installed."""
    try:
        return __import__(name)
    except ImportError:
        return None


def error_of(kind, call, check=None):
    """The exception of type `kind` that call() raises (AssertionError when it raises none, or another type, or
    `check(e)` is false)."""
    try:
        call()
    except kind as e:
        assert check is None or check(e), f"{call} raised {e!r}"
        return e
    raise AssertionError(f"{call} did not raise {kind.__name__}")


def run_as_script(namespace):
    """For `python3 test_x.py`: runs the module's tests with the shared runner and exits with its status."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from runner import run_tests  # noqa: PLC0415

    sys.exit(run_tests(namespace))
