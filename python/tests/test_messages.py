#!/usr/bin/env python3
"""What users read when something goes wrong: each error names the cause once and the user's path once (never a
temporary file's name), one errno maps to one exception type everywhere, and a CUDA device without a GPU is
OSError(ENODEV) before any framework is asked for memory.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_messages.py
"""
import errno
import json
import os
import re
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support import error_of, import_gdskit, optional, run_as_script  # noqa: E402

gdskit = import_gdskit()
np = optional("numpy")


def _says_it_once(e, path=None):
    """The message holds the path at most once and each errno text at most once."""
    text = str(e)
    if path is not None:
        assert text.count(path) == 1, text
        assert e.filename == path, (e.filename, path)
    assert ".gdskit-tmp." not in text, text
    if getattr(e, "errno", None):
        assert text.count(os.strerror(e.errno)) <= 1, text


def _write(path, header, data=b""):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def test_save_into_a_missing_folder_names_the_path_and_reads_nothing():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        staged = []
        real = np.ascontiguousarray

        def counting(x):
            staged.append(x.nbytes)
            return real(x)

        strided = np.arange(4096, dtype=np.float32).reshape(64, 64)[:, ::2]
        for target, kind in ((os.path.join(d, "no", "such", "m.safetensors"), FileNotFoundError),
                             (d, IsADirectoryError)):
            np.ascontiguousarray = counting
            try:
                e = error_of(Exception, lambda: gdskit.save_file({"a": strided}, target))
            finally:
                np.ascontiguousarray = real
            assert isinstance(e, kind), e
            _says_it_once(e, target)
        assert staged == [], "the tensors were read before the target was checked"
        assert os.listdir(d) == []


def test_existing_file_with_overwrite_false():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        gdskit.save_file({"a": np.zeros(3)}, p)
        e = error_of(Exception, lambda: gdskit.save_file({"a": np.ones(3)}, p, overwrite=False))
        assert isinstance(e, FileExistsError), e
        assert "overwrite=True replaces it" in str(e), str(e)  # the fix, in Python's words
        _says_it_once(e, p)


def test_malformed_files_say_what_they_are():
    with tempfile.TemporaryDirectory() as d:
        junk = os.path.join(d, "notes.txt")
        with open(junk, "w") as f:
            f.write("hello world, these are notes and not tensors\n" * 4)
        # "b" holds the bytes; the empty "a" sorts first and sits at the end: a cut file is blamed on "b".
        cut = os.path.join(d, "cut.safetensors")
        _write(cut, {"a": {"dtype": "F16", "shape": [0], "data_offsets": [40, 40]},
                     "b": {"dtype": "F32", "shape": [10], "data_offsets": [0, 40]}}, bytes(32))
        for path, words, absent in ((junk, "not a safetensors file", "exceeds"),
                                    (cut, f'truncated: expected {os.path.getsize(cut) + 8} bytes, the file has '
                                     f'{os.path.getsize(cut)} (tensor "b"', 'tensor "a"')):
            for call in (lambda: gdskit.header(path), lambda: gdskit.load_safetensors_raw(path),
                         lambda: gdskit.safe_open(path, "np")):
                e = error_of(Exception, call)
                assert isinstance(e, gdskit.SafetensorError) and e.errno == errno.EBADMSG, e
                assert words in str(e) and absent not in str(e), str(e)
                _says_it_once(e, path)


def test_missing_files_name_the_path_once():
    with tempfile.TemporaryDirectory() as d:
        missing = os.path.join(d, "nope.safetensors")
        for call in (lambda: gdskit.header(missing), lambda: gdskit.load_safetensors_raw(missing),
                     lambda: gdskit.File(missing), lambda: gdskit.safe_open(missing, "np")):
            e = error_of(Exception, call)
            assert isinstance(e, FileNotFoundError), e
            _says_it_once(e, missing)
        e = error_of(Exception, lambda: gdskit.File(d, "rb"))
        assert isinstance(e, IsADirectoryError)
        _says_it_once(e, d)
        # A name with a newline and a quote: the message shows it escaped, and only as the filename.
        odd = os.path.join(d, 'new\nline "q".safetensors')
        for call in (lambda: gdskit.load_safetensors_raw(odd), lambda: gdskit.File(odd)):
            e = error_of(Exception, call)
            assert isinstance(e, FileNotFoundError) and e.filename == odd, e
            assert str(e).count("line") == 1, str(e)


def test_one_exception_type_per_errno_on_load_and_save():
    """The engine's EINVAL is InvalidArgumentError (a ValueError and an OSError) whether a save or a load found
    it: `except ValueError` and `except OSError` both work everywhere."""
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        gdskit.save_file({"a": np.zeros(3, dtype=np.float32)}, p)
        found = [error_of(Exception, lambda: gdskit.save_file({"": np.zeros(2)}, os.path.join(d, "x.safetensors"))),
                 error_of(Exception, lambda: gdskit.load_safetensors_raw(p, only=["no.such.tensor"])),
                 error_of(Exception, lambda: gdskit.load_safetensors_raw(p, rank=3, world=2))]
        for e in found:
            assert type(e) is gdskit.InvalidArgumentError, (type(e), e)
            assert isinstance(e, ValueError) and isinstance(e, OSError) and e.errno == errno.EINVAL, e
            _says_it_once(e)
        assert not [n for n in os.listdir(d) if n != "m.safetensors"]


def test_cuda_device_without_gpu_is_enodev_everywhere():
    """docs/safetensors.md's promise: OSError ENODEV with the reason, before torch is asked for CUDA memory."""
    ok, why = gdskit.gpu_available()
    if ok:
        return "skip: a GPU is available here"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        _write(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8))
        calls = [lambda: gdskit.plan(p, "cuda:0"), lambda: gdskit.load_safetensors_raw(p, "cuda"),
                 lambda: gdskit.safe_open(p, "pt", device="cuda:0"), lambda: gdskit.File(p).plan("cuda:1")]
        try:
            import torch
            calls += [lambda: gdskit.load_file(p, device="cuda:0"), lambda: gdskit.load_safetensors(p, 0),
                      lambda: gdskit.load_file(p, device=torch.device("cuda", 0))]
        except ImportError:
            pass
        for call in calls:
            e = error_of(Exception, call)
            assert type(e) is OSError and e.errno == errno.ENODEV, (type(e), e)
            assert "no usable GPU" in str(e) and why in str(e), str(e)
            assert not str(e).endswith(os.strerror(errno.ENODEV)), str(e)  # the cause once, not twice


def test_save_reasons_speak_of_writes():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        # An unaligned host buffer, so the reasons include the bounce-buffer note.
        raw = np.zeros((1 << 20) + 64, dtype=np.uint8)
        a = raw[64 - raw.ctypes.data % 64 + 1:][:1 << 20]
        gdskit.save_file({"a": a}, os.path.join(d, "m.safetensors"))
        reasons = gdskit.last_save_stats()["reasons"]
        assert reasons and not [r for r in reasons if re.search(r"\breads\b", r)], reasons
        assert [r for r in reasons if "O_DIRECT writes go through bounce buffers" in r], reasons


def test_loads_and_saves_say_what_they_learned_in_one_line():
    """A shape the engine wrote to the profile folder during a load or a save (GDSKIT_LEARN) is said on stderr in
    the engine's one line, once; nothing is printed when nothing was learned."""
    import contextlib
    import io
    line = "learned: host reads depth 8 x 1.00 MiB on vda (gdskit tune --forget vda drops it)"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        _write(p, {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, bytes(4))
        real = gdskit._gdskit.take_learned_notice
        assert isinstance(real(), str)
        pending = []
        gdskit._gdskit.take_learned_notice = lambda: pending.pop() if pending else ""
        try:
            calls = [lambda: gdskit.load_safetensors_raw(p)]
            if _has("torch"):
                calls.append(lambda: gdskit.load_file(p))
            if np is not None:
                calls.append(lambda: gdskit.save_file({"a": np.zeros(4, np.uint8)}, os.path.join(d, "o.safetensors")))
            for call in calls:
                for learned in (True, False):
                    pending[:] = [line] if learned else []
                    err = io.StringIO()
                    with contextlib.redirect_stderr(err):
                        call()
                    assert err.getvalue() == (line + "\n" if learned else ""), (call, err.getvalue())
                    assert not pending, "the notice was not asked for"
        finally:
            gdskit._gdskit.take_learned_notice = real


def _has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    run_as_script(globals())
