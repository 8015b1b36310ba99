#!/usr/bin/env python3
"""gdskit.File as KvikIO users call it: (buf, size=None, file_offset=0, task_size=None), the older offset=
keyword, the refused ambiguous two-argument call, and the usual mode spellings.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_file.py
"""
import errno
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support import error_of, import_gdskit, optional, run_as_script  # noqa: E402

gdskit = import_gdskit()
np = optional("numpy")


def _data_file(d, nbytes=1 << 16, seed=7):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    p = os.path.join(d, "data.bin")
    data.tofile(p)
    return p, data


def test_kvikio_positional_and_keyword_arguments():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p, data = _data_file(d)
        with gdskit.File(p, "rb") as f:
            # (buf, size, file_offset): size bytes at file_offset into the start of buf, at odd sizes and offsets.
            for size, off in ((1, 0), (777, 12345), (4096, 4096), (5000, 3)):
                out = np.zeros(8192, dtype=np.uint8)
                assert f.read(out, size, off) == size
                assert out[:size].tobytes() == data[off:off + size].tobytes()
                assert not out[size:].any(), "bytes past size were written"
                assert f.pread(out, size, off).result() == size
            out = np.zeros(1000, dtype=np.uint8)
            assert f.read(out, size=10, file_offset=99) == 10 and out[:10].tobytes() == data[99:109].tobytes()
            assert f.read(out, file_offset=5) == 1000 and out.tobytes() == data[5:1005].tobytes()
            assert f.read(out, offset=6) == 1000 and out.tobytes() == data[6:1006].tobytes()  # the older keyword
            assert f.read(out, None, 7) == 1000 and out.tobytes() == data[7:1007].tobytes()
            assert f.read(out, 1000, 8, 1 << 20) == 1000 and out.tobytes() == data[8:1008].tobytes()  # task_size
            assert f.pread(out, file_offset=9, task_size=4096).get() == 1000
            assert out.tobytes() == data[9:1009].tobytes()
            assert f.read(out, size=0) == 0
            # At the end of the file: the bytes that exist.
            assert f.read(out, 100, data.nbytes - 30) == 30


def test_ambiguous_and_bad_arguments_are_refused():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p, data = _data_file(d)
        with gdskit.File(p, "r+b") as f:
            out = np.zeros(100, dtype=np.uint8)
            before = out.copy()
            for call in (lambda: f.read(out, 50), lambda: f.pread(out, 50), lambda: f.write(out, 50),
                         lambda: f.pwrite(out, 50)):
                e = error_of(TypeError, call)
                assert "size=50" in str(e) and "file_offset=50" in str(e), e
            assert (out == before).all()
            assert open(p, "rb").read() == data.tobytes(), "a refused write changed the file"
            error_of(TypeError, lambda: f.read(out, size=1, offset=2, file_offset=3))
            error_of(TypeError, lambda: f.read(out, 1, 2, size=3))
            error_of(TypeError, lambda: f.read(out, 1, 2, 3, 4))
            error_of(TypeError, lambda: f.read(out, bogus=1))
            error_of(TypeError, lambda: f.read(out, file_offset=1.5))
            error_of(TypeError, lambda: f.read(out, size=True, file_offset=0))
            error_of(ValueError, lambda: f.read(out, size=101, file_offset=0))
            error_of(ValueError, lambda: f.read(out, size=-1, file_offset=0))
            error_of(ValueError, lambda: f.read(out, file_offset=-1))
            error_of(ValueError, lambda: f.read(out, task_size=0))
            assert f.read(out, file_offset=np.int64(3)) == 100  # integer scalars are ints


def test_write_size_and_offset():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "w.bin")
        src = np.arange(256, dtype=np.uint8)
        with gdskit.File(p, "wb") as f:
            assert f.write(src, 10, 4093) == 10
            assert f.pwrite(src, file_offset=5000).result() == 256
            assert f.pwrite(src, 7, 4500).result() == 7  # the first 7 bytes of src only
        back = open(p, "rb").read()
        assert len(back) == 5256
        assert back[4093:4103] == src[:10].tobytes() and back[5000:] == src.tobytes()
        assert back[4500:4507] == src[:7].tobytes() and back[4507:5000] == bytes(493)
        assert back[:4093] == bytes(4093) and back[4103:4500] == bytes(397)
        wide = np.arange(64, dtype=np.float32)  # a size that is no whole number of elements
        with gdskit.File(p, "r+b") as f:
            assert f.pwrite(wide, 13, 0).result() == 13
            out = np.zeros(64, dtype=np.float32)
            assert f.pread(out, 13, 0).get() == 13
        assert out.view(np.uint8)[:13].tobytes() == wide.view(np.uint8)[:13].tobytes()
        assert not out.view(np.uint8)[13:].any()


def test_mode_spellings():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p, data = _data_file(d, 4096)
        one = np.zeros(16, dtype=np.uint8)
        for mode in ("r", "rb"):
            with gdskit.File(p, mode) as f:
                assert f.mode == mode and f.read(one) == 16
                error_of(OSError, lambda: f.write(one), lambda e: e.errno == errno.EBADF)
        for mode in ("r+", "r+b", "rb+"):
            with gdskit.File(p, mode) as f:
                assert f.read(one) == 16 and f.write(one, file_offset=16) == 16
        assert os.path.getsize(p) == 4096, "r+ must not truncate"
        for mode in ("w", "wb", "w+", "w+b", "wb+"):
            with gdskit.File(p, mode) as f:
                assert f.size == 0, mode
                assert f.write(data[:100]) == 100
                if "+" in mode:
                    assert f.read(one) == 16
        q = os.path.join(d, "new.bin")
        for mode in ("x", "xb", "x+b"):
            with gdskit.File(q, mode) as f:
                assert f.write(data[:10]) == 10
            error_of(FileExistsError, lambda: gdskit.File(q, mode), lambda e: e.filename == q)
            os.unlink(q)
        for mode, word in (("a", "append"), ("ab", "append"), ("a+", "append"), ("rt", "text"), ("t", "text"),
                           ("rw", "expected"), ("r++", "expected"), ("rbb", "expected"), ("", "empty"),
                           ("R", "expected"), (" r", "expected")):
            e = error_of(ValueError, lambda: gdskit.File(p, mode))
            assert word in str(e), (mode, str(e))
        error_of(TypeError, lambda: gdskit.File(p, 3))
        error_of(TypeError, lambda: gdskit.File(p, b"r"))


def test_special_files_are_refused_for_every_mode():
    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "pipe")
        os.mkfifo(fifo)
        for mode in ("r", "rb", "r+b", "w", "wb"):
            e = error_of(OSError, lambda: gdskit.File(fifo, mode))  # must not block
            assert e.errno == errno.EINVAL and e.filename == fifo, (mode, e)
        for mode in ("r", "w+b"):
            e = error_of(IsADirectoryError, lambda: gdskit.File(d, mode))
            assert e.filename == d


if __name__ == "__main__":
    run_as_script(globals())
