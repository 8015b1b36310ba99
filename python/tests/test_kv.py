#!/usr/bin/env python3
"""Tests of gdskit.kv.BlockStore on host memory (numpy, and torch CPU tensors when torch is installed; CUDA
tensors where a GPU is usable): round trips, keys and rows refused with clear errors, misses leaving rows
alone, futures (fileno, await, cancel), reopen, a kill -9 of a writing process, and threads.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_kv.py
"""
import asyncio
import errno
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

import gdskit
from gdskit.kv import BlockStore

np = pytest.importorskip("numpy")

BLOCK = 8192


def content(key, n=BLOCK):
    """The bytes of `key`'s block: a stream seeded by the key, checkable without keeping it."""
    seed = abs(hash(("kv-test", key))) % (2 ** 32)
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def blocks_for(keys, n=BLOCK):
    return np.stack([content(k, n) for k in keys])


def expect(exc_type, fn, *, errno_is=None, text=None):
    try:
        fn()
    except exc_type as e:
        if errno_is is not None:
            assert e.errno == errno_is, f"errno {e.errno}, not {errno_is}: {e}"
        if text is not None:
            assert text in str(e), f"{text!r} not in {e}"
        return e
    raise AssertionError(f"{exc_type.__name__} not raised")


def new_store(folder, **kw):
    args = dict(capacity_bytes=16 << 20, block_bytes=BLOCK, namespace="test/fp16", deadline_s=10.0)
    args.update(kw)
    return BlockStore(folder, **args)


def test_round_trip_rows_and_misses():
    with tempfile.TemporaryDirectory() as d, new_store(d) as s:
        keys = [b"\x01" * 32, b"ab", 7, -7, 2 ** 200, np.int64(9)]
        assert s.put(keys, blocks_for(keys)) == [True] * len(keys)
        out = np.full((len(keys) + 2, BLOCK), 0xAA, dtype=np.uint8)  # more rows than keys: fine for out
        asked = keys[:3] + [12345] + keys[3:]
        hits = s.get(asked, out)
        assert hits == [True, True, True, False, True, True, True]
        for i, k in enumerate(asked):
            if hits[i]:
                assert np.array_equal(out[i], content(k)), f"wrong bytes for {k!r}"
            else:
                assert (out[i] == 0xAA).all(), "a miss wrote its row"
        assert s.lookup([7, 8, b"ab"]) == [True, False, True]
        assert s.prefix([b"ab", 7, 8, -7]) == 2
        # Keys are typed: the int 7 and the bytes b"\x07" differ.
        assert s.lookup([b"\x07"]) == [False]
        st = s.stats()
        assert st["stored"] == len(keys) and st["hits"] == 6 and st["misses"] == 1
        assert st["checksum_failures"] == 0
        assert st["physical_bytes"] <= st["capacity_bytes"]


def test_list_of_rows_any_dtype():
    with tempfile.TemporaryDirectory() as d, new_store(d) as s:
        halves = [np.frombuffer(content(k).tobytes(), dtype=np.float16).copy() for k in (1, 2)]
        assert s.put([1, 2], halves) == [True, True]
        outs = [np.zeros(BLOCK // 4, dtype=np.float32) for _ in range(2)]
        assert s.get([2, 1], outs) == [True, True]
        assert outs[0].tobytes() == content(2).tobytes() and outs[1].tobytes() == content(1).tobytes()


def test_torch_cpu_and_cuda():
    try:
        import torch
    except ImportError:
        return "torch not installed"
    with tempfile.TemporaryDirectory() as d, new_store(d) as s:
        keys = list(range(100, 108))
        src = torch.from_numpy(blocks_for(keys))
        assert s.put(keys, src) == [True] * 8
        out = torch.zeros_like(src)
        assert s.get(keys, out) == [True] * 8
        assert torch.equal(out, src)
        expect(TypeError, lambda: s.put(keys, src.view(torch.int16)), text="uint8")
        ok, why = gdskit.gpu_available()
        if not (ok and torch.cuda.is_available()):
            return f"CPU tensors passed; no GPU here for the CUDA half ({why})"
        gpu_out = torch.zeros_like(src, device="cuda:0")
        assert s.get(keys, gpu_out) == [True] * 8
        assert torch.equal(gpu_out.cpu(), src)
        gpu_keys = list(range(200, 208))
        gsrc = torch.from_numpy(blocks_for(gpu_keys)).cuda()
        assert s.put(gpu_keys, gsrc) == [True] * 8
        back = torch.zeros_like(src)
        assert s.get(gpu_keys, back) == [True] * 8
        assert torch.equal(back, gsrc.cpu())
        # Stream ordering, get: a copy queued on the stream right after submit_get (the host does not wait)
        # sees the blocks; so does one queued after a kernel that keeps the stream busy first.
        stream = torch.cuda.Stream()
        gpu_out.zero_()
        seen = torch.empty_like(gpu_out)
        torch.cuda.synchronize()  # the zeros are in place before the get (the core copies on its own stream)
        f = s.submit_get(gpu_keys, gpu_out, stream=stream)
        with torch.cuda.stream(stream):
            seen.copy_(gpu_out)
        stream.synchronize()
        assert torch.equal(seen.cpu(), gsrc.cpu()), "work queued on the stream ran before the blocks landed"
        assert f.result(timeout=30) == [True] * 8
        # Stream ordering, put: a kernel queued before submit_put writes the blocks; the put must read them
        # after it, though the host never waited for the stream.
        put_keys = list(range(300, 308))
        fresh = torch.from_numpy(blocks_for(put_keys)).cuda()
        target = torch.zeros_like(fresh)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(50_000_000)  # tens of milliseconds of a busy stream
            target.copy_(fresh)
        p = s.submit_put(put_keys, target, stream=stream)
        assert p.result(timeout=30) == [True] * 8
        back = torch.zeros_like(src)
        assert s.get(put_keys, back) == [True] * 8
        assert torch.equal(back, fresh.cpu()), "the put read the blocks before the stream wrote them"
    return None


def test_bad_keys_and_rows_are_refused_before_any_io():
    with tempfile.TemporaryDirectory() as d, new_store(d) as s:
        one = blocks_for([1])
        expect(TypeError, lambda: s.put(b"abc", one), text="list of keys")
        expect(TypeError, lambda: s.put([True], one), text="bytes or int")
        expect(TypeError, lambda: s.put(["abc"], one), text="bytes or int")
        expect(ValueError, lambda: s.put([b"x" * 33], one), text="1 to 32")
        expect(ValueError, lambda: s.put([b""], one), text="1 to 32")
        expect(ValueError, lambda: s.put([2 ** 256], one), text="2**256")
        expect(TypeError, lambda: s.put([1], one.view(np.uint16)), text="uint8")
        expect(ValueError, lambda: s.put([1], np.zeros((1, BLOCK - 1), dtype=np.uint8)), text="shape")
        expect(ValueError, lambda: s.put([1, 2], one), text="rows")
        expect(ValueError, lambda: s.get([1, 2], np.zeros((1, BLOCK), dtype=np.uint8)), text="too few")
        ro = np.zeros((1, BLOCK), dtype=np.uint8)
        ro.setflags(write=False)
        expect(ValueError, lambda: s.get([1], ro), text="read-only")
        expect(ValueError, lambda: s.get([1], [np.zeros(2 * BLOCK, dtype=np.uint8)[::2]]), text="contiguous")
        expect(ValueError, lambda: s.put([1, 2], [content(1), content(2)[:-1]]), text="bytes")
        expect(TypeError, lambda: s.put([1], "nope"))
        assert s.stats()["puts"] == 0 and s.stats()["gets"] == 0


def test_bad_stores_are_refused_with_clear_errors():
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "afile")
        open(f, "w").close()
        expect(NotADirectoryError, lambda: new_store(f))
        expect(ValueError, lambda: new_store(os.path.join(d, "s"), capacity_bytes=BLOCK), text="below one block")
        expect(ValueError, lambda: new_store(os.path.join(d, "s"), durability="sometimes"), text="durability")
        expect(ValueError, lambda: new_store(os.path.join(d, "s"), deadline_s=0), text="deadline")
        expect(TypeError, lambda: new_store(os.path.join(d, "s"), block_bytes=1.5))
        with new_store(os.path.join(d, "s")):
            expect(OSError, lambda: new_store(os.path.join(d, "s")), errno_is=errno.EBUSY, text="in this process")
        expect(FileExistsError, lambda: new_store(os.path.join(d, "s"), namespace="other"), text="namespace")
        expect(FileExistsError, lambda: new_store(os.path.join(d, "s"), block_bytes=2 * BLOCK), text="blocks")
        s = new_store(os.path.join(d, "s"))
        s.close()
        s.close()
        expect(OSError, lambda: s.lookup([1]), errno_is=errno.EBADF)


def test_errors_take_the_modules_exception_types():
    """The store's errors leave through the compiled module's one translator: an errno gives the same Python
    exception type here as in a load, a save or a file (EINVAL: gdskit.InvalidArgumentError, a ValueError and an
    OSError)."""
    elsewhere = expect(ValueError, lambda: gdskit._gdskit.slice_plan("F32", [4], 0, 2, 1))  # rank 2 of 1
    assert type(elsewhere) is gdskit.InvalidArgumentError and elsewhere.errno == errno.EINVAL, repr(elsewhere)
    with tempfile.TemporaryDirectory() as d:
        for make in (lambda: new_store(os.path.join(d, "s"), capacity_bytes=BLOCK),
                     lambda: new_store([os.path.join(d, "a"), os.path.join(d, "a")]),
                     lambda: gdskit._gdskit.kv_capacity_for(1, 0, 1)):
            e = expect(ValueError, make)
            assert type(e) is type(elsewhere), f"{type(e).__name__} where a load raises {type(elsewhere).__name__}: {e}"
            assert isinstance(e, OSError) and e.errno == errno.EINVAL, repr(e)
        # Any other errno: the OSError subclass Python picks for it, in both.
        f = os.path.join(d, "afile")
        open(f, "w").close()
        store_error = expect(OSError, lambda: new_store(os.path.join(f, "s")), errno_is=errno.ENOTDIR)
        load_error = expect(OSError, lambda: gdskit.load_safetensors_raw(os.path.join(f, "m.safetensors")),
                            errno_is=errno.ENOTDIR)
        assert type(store_error) is type(load_error) is NotADirectoryError, (type(store_error), type(load_error))


def test_reopen_keeps_blocks_and_reads_only_the_checkpoint():
    with tempfile.TemporaryDirectory() as d:
        keys = list(range(50))
        with new_store(d, durability="persist") as s:
            assert all(s.put(keys, blocks_for(keys)))
            assert s.stats()["recovery"]["created"]
        with new_store(d, durability="persist") as s:
            r = s.stats()["recovery"]
            assert r["clean"] and r["from_checkpoint"] and r["headers_read"] == 0 and r["blocks"] == 50
            out = np.zeros((50, BLOCK), dtype=np.uint8)
            assert all(s.get(keys, out))
            assert np.array_equal(out, blocks_for(keys))


def test_capacity_eviction_and_pins():
    with tempfile.TemporaryDirectory() as d:
        cap = 600 * 1024  # room for a few dozen 8 KiB blocks with their headers and checkpoints
        with new_store(d, capacity_bytes=cap) as s:
            slots = s.stats()["slots"]
            assert 0 < slots < 60
            keep = list(range(4))
            s.put(keep, blocks_for(keep))
            assert s.pin(keep + [999]) == [True] * 4 + [False]
            for first in range(100, 700, 20):
                batch = list(range(first, first + 20))
                assert all(s.put(batch, blocks_for(batch)))
                assert s.stats()["physical_bytes"] <= cap
            out = np.zeros((4, BLOCK), dtype=np.uint8)
            assert s.get(keep, out) == [True] * 4, "a pinned block was evicted"
            assert s.stats()["evictions"] > 0 and s.stats()["pinned"] == 4
            s.unpin(keep)
            assert s.stats()["pinned"] == 0


def test_futures_fileno_await_cancel():
    with tempfile.TemporaryDirectory() as d, new_store(d) as s:
        keys = list(range(16))
        src = blocks_for(keys)
        f = s.submit_put(keys, src)
        r, _, _ = select.select([f.fileno()], [], [], 10)
        assert r == [f.fileno()] and f.done()
        assert f.result() == [True] * 16 and f.errors() == [0] * 16
        assert f.cancel() is False
        out = np.zeros_like(src)
        g = s.submit_get(keys + [999], np.zeros((17, BLOCK), dtype=np.uint8))
        assert g.result(timeout=10) == [True] * 16 + [False]
        assert g.errors()[-1] == errno.ENOENT

        async def main():
            return await s.submit_get(keys, out)

        assert asyncio.run(main()) == [True] * 16
        assert np.array_equal(out, src)
        seen = []
        h = s.submit_get(keys, out)
        h.add_done_callback(lambda fut: seen.append(fut.result()))
        h.result(timeout=10)
        for _ in range(100):
            if seen:
                break
            time.sleep(0.01)
        assert seen == [[True] * 16]


def test_threads_share_a_store():
    with tempfile.TemporaryDirectory() as d, new_store(d) as s:
        wrong = []

        def work(t):
            for r in range(20):
                keys = [t * 1000 + (r * 7 + i) % 50 for i in range(6)]
                keys = list(dict.fromkeys(keys))
                if r % 2 == 0:
                    s.put(keys, blocks_for(keys))
                else:
                    out = np.zeros((len(keys), BLOCK), dtype=np.uint8)
                    for k, hit, row in zip(keys, s.get(keys, out), out):
                        if hit and not np.array_equal(row, content(k)):
                            wrong.append(k)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []


CHILD = textwrap.dedent("""
    import sys, numpy as np
    from gdskit.kv import BlockStore
    folder, progress = sys.argv[1], sys.argv[2]
    s = BlockStore(folder, capacity_bytes=2 << 20, block_bytes=8192, namespace="crash", deadline_s=10.0)
    def content(k):
        return np.random.default_rng(k).integers(0, 256, 8192, dtype=np.uint8)
    i = 0
    while True:
        keys = list(range(i, i + 8))
        with open(progress, "w") as f:
            f.write(str(i + 8))
        s.put(keys, np.stack([content(k) for k in keys]))
        i += 8
""")


HOLDER = textwrap.dedent("""
    import sys
    from gdskit.kv import BlockStore
    s = BlockStore(sys.argv[1], capacity_bytes=16 << 20, block_bytes=8192, namespace="test/fp16", deadline_s=10.0)
    print("open", flush=True)
    sys.stdin.read()  # until the test closes the pipe
    s.close()
""")


def test_a_store_open_in_another_process_is_refused_naming_it():
    with tempfile.TemporaryDirectory() as d:
        folder = os.path.join(d, "s")
        p = subprocess.Popen([sys.executable, "-c", HOLDER, folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=dict(os.environ))
        try:
            assert p.stdout.readline().strip() == b"open", "the holder did not open the store"
            expect(OSError, lambda: new_store(folder), errno_is=errno.EBUSY, text=f"another process (pid {p.pid})")
        finally:
            p.stdin.close()
            assert p.wait(30) == 0
        with new_store(folder):  # the lock went with the holder
            pass


def test_kill_9_of_a_writer_then_right_bytes_or_misses():
    with tempfile.TemporaryDirectory() as d:
        folder, progress = os.path.join(d, "store"), os.path.join(d, "progress")
        env = dict(os.environ)
        hits = 0
        for round_ in range(2):
            if os.path.exists(progress):
                os.unlink(progress)
            p = subprocess.Popen([sys.executable, "-c", CHILD, folder, progress], env=env)
            # Once the writer is under way (on a loaded machine its start alone can take a second), a random
            # moment later.
            start = time.monotonic()
            while time.monotonic() - start < 30 and p.poll() is None:
                try:
                    if int(open(progress).read() or 0) >= 40:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.02)
            time.sleep((0.05, 0.25)[round_])
            p.send_signal(signal.SIGKILL)
            p.wait()
            try:
                upto = int(open(progress).read() or 0)
            except (OSError, ValueError):
                upto = 0
            with BlockStore(folder, capacity_bytes=2 << 20, block_bytes=8192, namespace="crash") as s:
                keys = list(range(upto))
                out = np.zeros((len(keys), 8192), dtype=np.uint8)
                for k, hit, row in zip(keys, s.get(keys, out) if keys else [], out):
                    if hit:
                        hits += 1
                        assert np.array_equal(row, np.random.default_rng(k).integers(0, 256, 8192, dtype=np.uint8))
        if hits == 0:
            return "the writer stored nothing before the kills (a slow machine): nothing was checked"
        return None
