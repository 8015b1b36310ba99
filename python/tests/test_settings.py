#!/usr/bin/env python3
"""gdskit.settings: attributes read and set the C++ core's process-wide settings, with their sources; the
context manager puts everything back, errors included; bad names and values are refused and change nothing.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_settings.py
"""
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support import error_of, import_gdskit, optional, run_as_script  # noqa: E402

gdskit = import_gdskit()
np = optional("numpy")
S = gdskit.settings


def _source(name):
    return next(e for e in S.describe() if e["name"] == name)["source"]


def test_attributes_have_python_types_and_sources():
    with S():
        S.reset()
        assert isinstance(S.threads, int) and S.threads >= 1
        assert isinstance(S.chunk_bytes, int) and S.chunk_bytes % 4096 == 0
        assert isinstance(S.adaptive, bool) and isinstance(S.direct, str)
        S.threads = 5
        S.chunk_bytes = "1M"
        S.adaptive = False
        S.direct = "off"
        S.inline_bytes = 65536
        assert (S.threads, S.chunk_bytes, S.adaptive, S.direct, S.inline_bytes) == (5, 1 << 20, False, "off", 65536)
        assert _source("threads") == "code" and _source("engine") == "default"
        del S.threads
        assert _source("threads") == "default"
        rows = S.describe()
        assert [r["name"] for r in rows][:3] == ["threads", "adaptive", "learn"]
        assert all(r["variable"].startswith("GDSKIT_") and r["help"] for r in rows)
        assert "chunk_bytes" in dir(S) and "describe" in dir(S)
        text = repr(S)
        assert "chunk_bytes" in text and "code" in text


def test_context_manager_restores_values_and_sources():
    S.reset()
    before = S.describe()
    with S(threads=3, direct="off", learn=False) as s:
        assert s is S and (S.threads, S.direct, S.learn) == (3, "off", False)
        S.engine = "threads"  # changed inside the block: also put back
    assert S.describe() == before
    try:
        with S(threads=2):
            raise KeyError("inside")
    except KeyError:
        pass
    assert S.describe() == before
    # A refused value in the block's arguments: nothing stays changed.
    error_of(ValueError, lambda: S(threads=4, chunk_bytes=1000).__enter__())
    assert S.describe() == before


def test_refused_names_and_values():
    S.reset()
    before = S.describe()
    for name, value, kind in (("threads", 0, ValueError), ("threads", "many", ValueError), ("chunk_bytes", 1000, ValueError),
                              ("direct", "sometimes", ValueError), ("direct", 1, TypeError), ("threads", True, TypeError),
                              ("adaptive", 2.5, TypeError), ("staging_slots", 1, ValueError)):
        e = error_of(kind, lambda: setattr(S, name, value))
        assert name in str(e), e
        if kind is ValueError:
            assert isinstance(e, gdskit.InvalidArgumentError) and e.errno == 22, e
    error_of(AttributeError, lambda: S.no_such_setting)
    error_of(AttributeError, lambda: setattr(S, "no_such_setting", 1))
    error_of(AttributeError, lambda: delattr(S, "no_such_setting"))
    assert S.describe() == before


def test_environment_is_the_source_until_code_sets_it():
    code = ("import gdskit; s = gdskit.settings; "
            "print(s.threads, [e['source'] for e in s.describe() if e['name'] == 'threads'][0]); "
            "s.threads = 6; print(s.threads, [e['source'] for e in s.describe() if e['name'] == 'threads'][0])")
    env = dict(os.environ, GDSKIT_THREADS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["3", "environment", "6", "code"], out
    env["GDSKIT_THREADS"] = "0"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "GDSKIT_THREADS" in r.stderr, r.stderr


def test_settings_apply_to_files_opened_afterwards():
    """A handle opened inside the block uses the block's settings: direct="off" means no O_DIRECT."""
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.bin")
        np.zeros(1 << 16, dtype=np.uint8).tofile(p)
        with S(direct="off"):
            with gdskit.File(p) as f:
                _, reasons = f.plan("cpu")
        assert not [r for r in reasons if "O_DIRECT host reads" in r], reasons


def test_threads_read_and_write_at_once():
    S.reset()
    errors = []

    def reader():
        try:
            for _ in range(2000):
                assert S.inline_bytes % 4096 == 0
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def writer():
        try:
            for i in range(500):
                S.inline_bytes = 4096 * (1 + i % 9)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    S.reset("inline_bytes")
    assert not errors, errors


if __name__ == "__main__":
    run_as_script(globals())
