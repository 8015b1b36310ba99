#!/usr/bin/env python3
"""The file side of the Distributed Checkpoint backend, without torch: write_files publishes every data file
whole or not at all from one batch, read_slices reads parts of stored chunks from several files as batches.
(The backend itself, with torch >= 2.1: test_dcp.py.)

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_checkpoint_files.py
"""
import errno
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support import error_of, import_gdskit, optional, run_as_script  # noqa: E402

gdskit = import_gdskit()
np = optional("numpy")


def _items(rng, count):
    """Random arrays and the 4 KiB-aligned offsets the writer gives them."""
    arrays, ranges, off = [], [], 0
    for _ in range(count):
        a = rng.integers(0, 256, int(rng.integers(1, 20000)), dtype=np.uint8)
        arrays.append(a)
        ranges.append((a.ctypes.data, a.nbytes, off, -1))
        off = (off + a.nbytes + 4095) // 4096 * 4096
    return arrays, ranges


def test_write_files_publishes_every_file_with_its_bytes():
    if np is None:
        return "skip: numpy not installed"
    from gdskit import _gdskit

    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as d:
        files, expect = [], {}
        for k in range(3):
            arrays, ranges = _items(rng, 1 + k * 4)
            path = os.path.join(d, f"__0_{k}.gdskit.distcp")
            files.append((path, ranges))
            expect[path] = (arrays, ranges)
        files.append((os.path.join(d, "empty.distcp"), []))
        for sync in (False, True):
            written, _ = _gdskit.write_files(files, sync)
            assert written == sum(a.nbytes for arrays, _ in expect.values() for a in arrays)
            for path, (arrays, ranges) in expect.items():
                data = open(path, "rb").read()
                for a, (_, n, off, _) in zip(arrays, ranges):
                    assert data[off:off + n] == a.tobytes()
            assert os.path.getsize(os.path.join(d, "empty.distcp")) == 0
            assert not [n for n in os.listdir(d) if ".gdskit-tmp." in n]


def test_write_files_failure_publishes_nothing_and_names_the_final_file():
    if np is None:
        return "skip: numpy not installed"
    from gdskit import _gdskit

    rng = np.random.default_rng(6)
    with tempfile.TemporaryDirectory() as d:
        arrays, ranges = _items(rng, 3)
        good = os.path.join(d, "a.distcp")
        old = b"old checkpoint bytes"
        with open(good, "wb") as f:
            f.write(old)
        # The second file's ranges overlap: refused before any write, and nothing is renamed.
        bad = os.path.join(d, "b.distcp")
        overlapping = [ranges[0], (ranges[1][0], ranges[1][1], 0, -1)]
        e = error_of(OSError, lambda: _gdskit.write_files([(good, ranges), (bad, overlapping)], True))
        assert e.errno == errno.EINVAL, e
        assert ".gdskit-tmp." not in str(e) and e.filename in (good, bad), e
        assert open(good, "rb").read() == old and not os.path.exists(bad)
        assert sorted(os.listdir(d)) == ["a.distcp"]
        # A folder that is missing: ENOENT naming the file asked for.
        missing = os.path.join(d, "no", "c.distcp")
        e = error_of(FileNotFoundError, lambda: _gdskit.write_files([(missing, ranges)], False))
        assert e.filename == missing and ".gdskit-tmp." not in str(e), e


def test_read_slices_reads_parts_of_chunks_across_files():
    if np is None:
        return "skip: numpy not installed"
    from gdskit import _gdskit

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as d:
        chunks, paths = [], []
        for k in range(2):
            a = rng.standard_normal((40, 30, 6)).astype(np.float32)
            p = os.path.join(d, f"c{k}.bin")
            with open(p, "wb") as f:
                f.write(b"\0" * 4096 + a.tobytes())
            chunks.append(a)
            paths.append(p)
        parts = [((0, 40), (0, 30), (0, 6)), ((5, 7), (0, 30), (0, 6)), ((3, 1), (2, 20), (1, 4)),
                 ((0, 40), (29, 1), (0, 6)), ((39, 1), (0, 30), (5, 1))]
        items, outs, wants = [], [], []
        for k, p in enumerate(paths):
            for part in parts:
                want = chunks[k][tuple(slice(o, o + n) for o, n in part)]
                out = np.zeros(want.shape, dtype=np.float32)
                items.append((p, 4096, [40, 30, 6], 4, [(o, n, 1) for o, n in part], out.ctypes.data, out.nbytes,
                              -1))
                outs.append(out)
                wants.append(want)
        got = _gdskit.read_slices(items)
        assert got >= sum(w.nbytes for w in wants)
        for out, want in zip(outs, wants):
            assert np.array_equal(out, want)
        # A file that is too short fails naming it; a FIFO is refused, never opened for a blocking read.
        with open(paths[0], "r+b") as f:
            f.truncate(4096 + 100)
        e = error_of(OSError, lambda: _gdskit.read_slices(items[:1]))
        assert e.filename == paths[0], e
        fifo = os.path.join(d, "pipe")
        os.mkfifo(fifo)
        e = error_of(OSError, lambda: _gdskit.read_slices([(fifo,) + items[0][1:]]))
        assert e.errno == errno.EINVAL and e.filename == fifo, e


if __name__ == "__main__":
    run_as_script(globals())
