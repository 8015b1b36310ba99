#!/usr/bin/env python3
"""Batches and row gathers from Python: read_into / write_from / submit_* / BatchFuture / gather_rows against
plain reads and numpy, on random data with unaligned offsets and odd sizes; bad items refused before any I/O.
GPU parts skip with the reason where no GPU (or torch with CUDA) is usable.

    PYTHONPATH=<build>/python python3 -m pytest -q python/tests/test_batch.py
"""
import asyncio
import concurrent.futures
import errno
import os
import random
import select
import tempfile

import pytest

import gdskit

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


def _file(d, name, size, seed):
    data = random.Random(seed).randbytes(size)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, data


def test_read_into_many_items_across_files():
    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as d:
        files = [_file(d, f"f{k}", 700_001 + 13 * k, k) for k in range(3)]
        opened = gdskit.File(files[1][0])
        items, expect = [], []
        for i in range(2000):
            k = rng.randrange(3)
            path, data = files[k]
            n = rng.choice([1, 7, 4096, 5000, 65536, rng.randrange(1, 200_000)])
            off = rng.randrange(0, len(data) - n)
            buf = bytearray(n)
            items.append((opened if k == 1 and i % 2 else path, off, buf))
            expect.append(data[off:off + n])
        res = gdskit.read_into(items)
        assert res.ok and res.failed == 0 and len(res) == 2000
        assert res.nbytes == sum(len(e) for e in expect)
        for (_, _, buf), e, r in zip(items, expect, res):
            assert bytes(buf) == e
            assert r.nbytes == len(e) and r.error is None
        opened.close()


def test_short_item_fails_alone_with_enodata():
    with tempfile.TemporaryDirectory() as d:
        path, data = _file(d, "f", 10_000, 1)
        a, b, c = bytearray(100), bytearray(4096), bytearray(50)
        try:
            gdskit.read_into([(path, 0, a), (path, 8000, b), (path, 9000, c)])
            raise AssertionError("a short item must fail")
        except gdskit.BatchError as e:
            assert isinstance(e, OSError)
            assert e.errno == errno.ENODATA and e.failed == [1]
            assert e.results[1].nbytes == 2000 and e.results[1].error.errno == errno.ENODATA
            assert e.filename == path
        assert bytes(a) == data[:100] and bytes(c) == data[9000:9050]
        res = gdskit.read_into([(path, 8000, b)], exact=False)
        assert res[0].nbytes == 2000 and bytes(b[:2000]) == data[8000:]


def test_write_from_then_read_back():
    rng = random.Random(9)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "new.bin")
        items, image, pos = [], bytearray(), 11
        for i in range(300):
            n = rng.randrange(1, 30_000)
            data = rng.randbytes(n)
            items.append((path, pos, data if i % 2 else bytearray(data)))
            image.extend(b"\0" * (pos + n - len(image)))
            image[pos:pos + n] = data
            pos += n + rng.choice([0, 0, 4096, 17])
        rng.shuffle(items)
        res = gdskit.write_from(items)
        assert res.ok
        with open(path, "rb") as f:
            assert f.read() == bytes(image)
        # Never truncated: a second write of one item leaves the rest.
        gdskit.write_from([(path, 0, b"xyz")])
        with open(path, "rb") as f:
            disk = f.read()
        assert disk[:3] == b"xyz" and disk[3:] == bytes(image[3:])


def test_bad_items_are_refused_before_any_io():
    with tempfile.TemporaryDirectory() as d:
        path, _ = _file(d, "f", 4096, 2)
        buf = bytearray(100)
        closed = gdskit.File(path, "r")
        closed.close()
        cases = [
            ([(path, 0, buf), (path, -1, bytearray(4))], ValueError, "item 1"),
            ([(path, 0, buf), (path, 0)], TypeError, "item 1"),
            ([(path, 0, buf), (object(), 0, bytearray(4))], TypeError, "item 1"),
            ([(path, 0, buf), (path, 0, b"read-only")], ValueError, "item 1"),
            ([(path, 0, buf), (path, 0, memoryview(buf)[10:20])], OSError, "item 1"),  # overlapping destinations
            ([(path, 0, buf), (path, 1 << 63, bytearray(4))], OSError, "item 1"),
            ([(path, 0, buf), (path, 1 << 64, bytearray(4))], OSError, "item 1"),  # past what C++ can take
            ([(path, 0, buf), (path, (1 << 63) - 2, bytearray(4))], OSError, "item 1"),  # ends past it
            ([(path, 0, buf), (closed, 0, bytearray(4))], ValueError, "item 1"),
            ([(path, 0, buf), (os.path.join(d, "missing"), 0, bytearray(4))], FileNotFoundError, None),
        ]
        for items, exc, text in cases:
            try:
                gdskit.read_into(items)
                raise AssertionError(f"accepted {items!r}")
            except exc as e:
                assert text is None or text in str(e), str(e)
        assert bytes(buf) == b"\0" * 100
        for bad in (-1, "soon", float("nan")):
            try:
                gdskit.read_into([(path, 0, buf)], deadline_s=bad)
                raise AssertionError("bad deadline accepted")
            except (ValueError, TypeError):
                pass
        # Writes refused before any I/O leave no file behind, whether a later item fails in Python's checks or
        # in the engine's (two writes to overlapping bytes), and an existing file is never touched.
        before = os.listdir(d)
        for items in ([(os.path.join(d, "new1"), 0, b"abc"), (path, -1, b"x")],
                      [(os.path.join(d, "new2"), 0, b"abcdef"), (os.path.join(d, "new2"), 3, b"xyz")],
                      [(os.path.join(d, "new3"), 0, b"abc"), (os.path.join(d, "missing-dir", "f"), 0, b"x")]):
            try:
                gdskit.write_from(items)
                raise AssertionError(f"accepted {items!r}")
            except (OSError, ValueError):
                pass
            assert sorted(os.listdir(d)) == sorted(before), os.listdir(d)


def test_fifo_and_device_files_are_refused_without_blocking():
    import threading

    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        for path, write in ((fifo, False), (fifo, True), ("/dev/null", False), ("/dev/zero", True)):
            outcome = []

            def attempt():
                try:
                    if write:
                        gdskit.write_from([(path, 0, bytearray(10))])
                    else:
                        gdskit.read_into([(path, 0, bytearray(10))])
                    outcome.append("moved bytes")
                except OSError as e:
                    outcome.append(e)

            t = threading.Thread(target=attempt, daemon=True)
            t.start()
            t.join(10)
            if t.is_alive():  # a regression: open the other end so that the blocked open returns, then fail
                os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
                t.join(10)
                raise AssertionError(f"{path}: the batch blocked")
            e = outcome[0]
            assert isinstance(e, OSError), (path, write, e)
            assert e.errno == errno.EINVAL, (path, write, e)
            assert "item 0" in str(e) and path in str(e), (path, write, str(e))


def test_deadline_zero_times_out_every_item():
    with tempfile.TemporaryDirectory() as d:
        path, _ = _file(d, "f", 100_000, 4)
        bufs = [bytearray(1000) for _ in range(20)]
        try:
            gdskit.read_into([(path, i * 1000, b) for i, b in enumerate(bufs)], deadline_s=0)
            raise AssertionError("no timeout")
        except gdskit.BatchError as e:
            assert e.errno == errno.ETIMEDOUT and len(e.failed) == 20
            assert isinstance(e.results[0].error, TimeoutError)


def test_future_result_fileno_await_and_concurrent_wait():
    with tempfile.TemporaryDirectory() as d:
        path, data = _file(d, "f", 1 << 20, 5)
        bufs = [bytearray(4096) for _ in range(64)]
        items = [(path, i * 8192 + 3, b) for i, b in enumerate(bufs)]
        fut = gdskit.submit_reads(items)
        assert isinstance(fut, concurrent.futures.Future)
        r, _, _ = select.select([fut.fileno()], [], [], 10)
        assert r, "the event descriptor never became readable"
        done, _ = concurrent.futures.wait([fut], timeout=10)
        assert fut in done
        res = fut.result(timeout=10)
        assert res.ok and all(bytes(b) == data[i * 8192 + 3:i * 8192 + 3 + 4096] for i, b in enumerate(bufs))
        assert fut.cancel() is False
        fut.wait_released()

        async def main():
            return await gdskit.submit_reads([(path, 0, bytearray(10))])

        res2 = asyncio.run(main())
        assert res2.ok and res2.nbytes == 10


def test_future_error_is_batch_error():
    with tempfile.TemporaryDirectory() as d:
        path, _ = _file(d, "f", 1000, 6)
        fut = gdskit.submit_reads([(path, 900, bytearray(200))])
        try:
            fut.result(timeout=10)
            raise AssertionError("no error")
        except gdskit.BatchError as e:
            assert e.errno == errno.ENODATA


def test_gather_rows_npy_equals_numpy():
    if np is None:
        return "numpy not installed"
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        for shape, dtype in [((1000, 33), np.float32), ((777,), np.int64), ((50, 3, 5), np.float16),
                             ((300, 4096 // 4), np.float32), ((10, 7), np.uint8)]:
            a = (rng.standard_normal(shape) * 100).astype(dtype)
            path = os.path.join(d, "a.npy")
            np.save(path, a)
            idx = rng.integers(-shape[0], shape[0], size=2000)
            idx[:3] = [0, shape[0] - 1, -1]
            got = gdskit.gather_rows(path, idx)
            expect = np.load(path, mmap_mode="r")[idx]
            got_np = got.numpy() if torch is not None and isinstance(got, torch.Tensor) else got
            assert got_np.shape == expect.shape
            assert got_np.tobytes() == np.ascontiguousarray(expect).tobytes()
            out = np.empty_like(expect)
            assert gdskit.gather_rows(path, idx, out=out) is out and out.tobytes() == expect.tobytes()
            assert gdskit.gather_rows(path, []).shape[0] == 0
            # Out of range however they come. numpy refuses all but the largest unsigned one, which it wraps into
            # the index -1 (the last row); gather_rows refuses that too rather than read a row nobody asked for.
            for bad in ([shape[0]], [-shape[0] - 1], np.array([2**64 - 1], dtype=np.uint64),
                        np.array([shape[0]], dtype=np.uint8 if shape[0] < 256 else np.uint32), [2**70], [-(2**70)]):
                if not (isinstance(bad, np.ndarray) and bad.dtype == np.uint64):
                    try:
                        np.load(path, mmap_mode="r")[bad]
                        raise AssertionError(f"numpy accepted {bad!r}")
                    except IndexError:
                        pass
                try:
                    gdskit.gather_rows(path, bad)
                    raise AssertionError(f"out-of-range index accepted: {bad!r}")
                except IndexError as e:
                    assert "out of bounds" in str(e), str(e)
            # An `out` of the wrong size, or read-only, is refused before any I/O and left as it was.
            for bad_out in (np.full((len(idx) - 1,) + expect.shape[1:], 7, dtype=expect.dtype),
                            np.full(expect.size * 2, 7, dtype=expect.dtype)):
                try:
                    gdskit.gather_rows(path, idx, out=bad_out)
                    raise AssertionError(f"an out of {bad_out.nbytes} bytes was accepted")
                except ValueError as e:
                    assert "out holds" in str(e), str(e)
                assert (bad_out == 7).all()
            frozen = np.zeros_like(expect)
            frozen.flags.writeable = False
            try:
                gdskit.gather_rows(path, idx, out=frozen)
                raise AssertionError("a read-only out was accepted")
            except (ValueError, TypeError):
                pass
            ok = np.array([shape[0] - 1, 0], dtype=np.uint64)
            got = gdskit.gather_rows(path, ok)
            got_np = got.numpy() if torch is not None and isinstance(got, torch.Tensor) else got
            assert got_np.tobytes() == np.ascontiguousarray(np.load(path, mmap_mode="r")[ok]).tobytes()


def test_gather_rows_rowfile_and_bad_files():
    if np is None:
        return "numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        raw = np.arange(100 * 6, dtype=np.int32).reshape(100, 6)
        path = os.path.join(d, "rows.bin")
        with open(path, "wb") as f:
            f.write(b"HEADER!!" + raw.tobytes())
        got = gdskit.gather_rows(gdskit.RowFile(path, np.int32, (6,), offset=8), [5, 99, 0, 5])
        got_np = got.numpy() if torch is not None and isinstance(got, torch.Tensor) else got
        assert got_np.tolist() == raw[[5, 99, 0, 5]].tolist()
        notnpy = os.path.join(d, "x.npy")
        with open(notnpy, "wb") as f:
            f.write(b"\x00" * 200)
        try:
            gdskit.gather_rows(notnpy, [0])
            raise AssertionError("a non-.npy file was read")
        except OSError as e:
            assert e.errno == errno.EBADMSG and "not a .npy file" in str(e)
        cut = os.path.join(d, "cut.npy")
        np.save(cut, np.zeros((100, 10), np.float32))
        with open(cut, "r+b") as f:
            f.truncate(os.path.getsize(cut) - 100)
        try:
            gdskit.gather_rows(cut, [0])
            raise AssertionError("a truncated .npy was read")
        except OSError as e:
            assert e.errno == errno.EBADMSG and "shorter" in str(e)


@pytest.mark.gpu
def test_gpu_batch_and_gather():
    ok, reason = gdskit.gpu_available()
    if not ok:
        return f"no usable GPU: {reason}"
    if torch is None or not torch.cuda.is_available():
        return "torch with CUDA not installed"
    with tempfile.TemporaryDirectory() as d:
        path, data = _file(d, "f", 3 << 20, 7)
        ts = [torch.empty(n, dtype=torch.uint8, device="cuda:0") for n in (1, 4095, 4096, 70_000, 1 << 20)]
        offs = [0, 1, 4096, 12345, 2 << 20]
        res = gdskit.read_into([(path, o, t) for o, t in zip(offs, ts)])
        assert res.ok
        for o, t in zip(offs, ts):
            assert bytes(t.cpu().numpy()) == data[o:o + t.numel()]
        s = torch.cuda.Stream()
        t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
        fut = gdskit.submit_reads([(path, 5, t)], stream=s)
        with torch.cuda.stream(s):
            total = t.to(torch.int64).sum()
        fut.result(timeout=30)
        assert int(total.item()) == sum(data[5:5 + (1 << 20)])
        if np is not None:
            a = np.random.default_rng(2).standard_normal((5000, 256)).astype(np.float32)
            p = os.path.join(d, "e.npy")
            np.save(p, a)
            idx = np.random.default_rng(3).integers(0, 5000, 3000)
            g = gdskit.gather_rows(p, idx, device="cuda:0")
            assert g.is_cuda and g.cpu().numpy().tobytes() == a[idx].tobytes()
