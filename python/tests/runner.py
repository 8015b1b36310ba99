"""A tiny runner for the script-style Python tests: runs every test_* function of a module's namespace, prints
PASS / SKIP (a test returns its skip reason) / FAIL, and returns the exit status."""


def run_tests(namespace) -> int:
    failed = 0
    for name, fn in sorted(namespace.items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        try:
            r = fn()
            print(f"{'SKIP' if r else 'PASS'} {name}{' (' + r + ')' if r else ''}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    return 1 if failed else 0
