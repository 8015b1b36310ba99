"""TEST STAND-IN of gdskit.kv.BlockStore for the engine adapter tests (no test functions here).

An in-memory store with the block store's Python API (BlockStore(paths, *, capacity_bytes, block_bytes,
namespace, durability, deadline_s); put/get/lookup/prefix/pin/unpin/stats/close; submit_put/submit_get returning
a future with fileno/done/result/cancel/__await__) and the behaviour the adapters rely on: whole blocks only,
rows of `out` written only for hits, capacity eviction in insertion order that never takes a pinned block, a put
that finds no room fails its keys, one open store per folder, contents kept across close and reopen of the same
folders and namespace. Faults are injected through `faults`. It stands in until the real store is on the
branch; it is not the store.
"""
import asyncio
import os
import threading
from collections import OrderedDict

_disks = {}          # (folders, namespace) -> {"blocks": OrderedDict(key -> bytes), "block_bytes": n}
_open_folders = set()
_lock = threading.Lock()

# Fault injection: keys whose put fails, keys whose get misses (as a failed checksum would), and a delay (s)
# before every batch future completes.
faults = {"put_fail": set(), "get_miss": set(), "delay_s": 0.0}


def reset():
    with _lock:
        _disks.clear()
        _open_folders.clear()
    faults["put_fail"].clear()
    faults["get_miss"].clear()
    faults["delay_s"] = 0.0


def _rows(blocks, n, block_bytes, writable):
    """Per-row byte views (numpy uint8 arrays) of a [n, block_bytes] tensor/array or a list of n blocks."""
    import numpy as np

    def as_np(x):
        if hasattr(x, "detach"):  # torch
            if x.device.type != "cpu":
                raise ValueError("the stand-in store takes CPU and CUDA tensors only")
            if not x.is_contiguous():
                raise ValueError("blocks must be contiguous")
            x = x.numpy()
        if not isinstance(x, np.ndarray):
            raise TypeError(f"blocks must be tensors or arrays, not {type(x).__name__}")
        if not x.flags["C_CONTIGUOUS"]:
            raise ValueError("blocks must be contiguous")
        if writable and not x.flags["WRITEABLE"]:
            raise ValueError("out is read-only")
        return x.reshape(-1).view(np.uint8)

    if isinstance(blocks, (list, tuple)):
        if len(blocks) != n:
            raise ValueError(f"{n} keys but {len(blocks)} blocks")
        rows = [as_np(b) for b in blocks]
    else:
        flat = as_np(blocks)
        if flat.size != n * block_bytes:
            raise ValueError(f"blocks hold {flat.size} bytes, not {n} x {block_bytes}")
        rows = [flat[i * block_bytes:(i + 1) * block_bytes] for i in range(n)]
    for r in rows:
        if r.size != block_bytes:
            raise ValueError(f"a block of {r.size} bytes, not {block_bytes}")
    return rows


def _on_gpu(blocks):
    first = blocks[0] if isinstance(blocks, (list, tuple)) and blocks else blocks
    return hasattr(first, "is_cuda") and first.is_cuda


def _check_keys(keys):
    if isinstance(keys, (bytes, str)):
        raise TypeError("keys must be a list")
    out = []
    for k in keys:
        if isinstance(k, bool) or not isinstance(k, (bytes, int)):
            raise TypeError(f"a key must be bytes or int, not {type(k).__name__}")
        if isinstance(k, bytes) and not 0 < len(k) <= 32:
            raise ValueError(f"a key of {len(k)} bytes (1 to 32)")
        out.append(k)
    return out


class Future:
    """The batch future: an eventfd that becomes readable (and stays so) when the batch is done."""

    def __init__(self):
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._result = None
        self._error = None

    def fileno(self):
        return self._fd

    def done(self):
        return self._done.is_set()

    def cancel(self):
        if self._done.is_set():
            return False
        self._cancel.set()
        return True

    def result(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError("batch not done")
        if self._error is not None:
            raise self._error
        return self._result

    def __await__(self):
        return asyncio.get_event_loop().run_in_executor(None, self.result).__await__()

    def _finish(self, result=None, error=None):
        self._result, self._error = result, error
        self._done.set()
        os.eventfd_write(self._fd, 1)

    def __del__(self):
        try:
            os.close(self._fd)
        except OSError:
            pass


class BlockStore:
    def __init__(self, paths, *, capacity_bytes, block_bytes, namespace="", durability="cache", deadline_s=2.0):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        folders = tuple(sorted(os.path.realpath(os.fspath(p)) for p in paths))
        for f in folders:
            if not os.path.isdir(f):
                raise NotADirectoryError(20, "not a folder", f)
        if block_bytes <= 0 or capacity_bytes < block_bytes:
            raise ValueError("capacity smaller than one block")
        if durability not in ("cache", "persist"):
            raise ValueError(f"durability {durability!r}")
        with _lock:
            busy = [f for f in folders if f in _open_folders]
            if busy:
                raise BlockingIOError(11, "store folder in use by another writer", busy[0])
            disk = _disks.setdefault((folders, namespace), {"blocks": OrderedDict(), "block_bytes": block_bytes})
            if disk["block_bytes"] != block_bytes:
                raise ValueError("the folder holds a store of another block size")
            _open_folders.update(folders)
        self.folders = folders
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.capacity_blocks = capacity_bytes // block_bytes
        self._blocks = disk["blocks"]
        self._pins = set()
        self._closed = False
        self._mu = threading.Lock()
        self.counts = {"put": 0, "get": 0, "put_calls": 0, "get_calls": 0, "evicted": 0}

    # -- synchronous API --------------------------------------------------------------------------------------
    def put(self, keys, blocks):
        if _on_gpu(blocks):  # GPU memory goes through host copies here (the real store moves it itself)
            blocks = [b.cpu() for b in blocks] if isinstance(blocks, (list, tuple)) else blocks.cpu()
        keys = _check_keys(keys)
        rows = _rows(blocks, len(keys), self.block_bytes, writable=False)
        self._check_open()
        out = []
        with self._mu:
            self.counts["put_calls"] += 1
            for k, r in zip(keys, rows):
                if k in faults["put_fail"]:
                    out.append(False)
                    continue
                if k not in self._blocks and len(self._blocks) >= self.capacity_blocks:
                    victim = next((v for v in self._blocks if v not in self._pins), None)
                    if victim is None:
                        out.append(False)
                        continue
                    del self._blocks[victim]
                    self.counts["evicted"] += 1
                self._blocks[k] = bytes(r)
                self.counts["put"] += 1
                out.append(True)
        return out

    def get(self, keys, out):
        if _on_gpu(out):
            import torch
            host = torch.empty(out.shape, dtype=out.dtype)
            hits = self.get(keys, host)
            for i, hit in enumerate(hits):
                if hit:
                    out[i].copy_(host[i])
            torch.cuda.synchronize(out.device)
            return hits
        keys = _check_keys(keys)
        rows = _rows(out, len(keys), self.block_bytes, writable=True)
        self._check_open()
        hits = []
        with self._mu:
            self.counts["get_calls"] += 1
            for k, r in zip(keys, rows):
                data = self._blocks.get(k)
                if data is None or k in faults["get_miss"]:
                    hits.append(False)
                    continue
                r[:] = memoryview(data)
                self.counts["get"] += 1
                hits.append(True)
        return hits

    def lookup(self, keys):
        keys = _check_keys(keys)
        self._check_open()
        with self._mu:
            return [k in self._blocks for k in keys]

    def prefix(self, keys):
        n = 0
        for present in self.lookup(keys):
            if not present:
                break
            n += 1
        return n

    def pin(self, keys):
        with self._mu:
            self._pins.update(k for k in _check_keys(keys) if k in self._blocks)

    def unpin(self, keys):
        with self._mu:
            self._pins.difference_update(_check_keys(keys))

    def stats(self):
        with self._mu:
            return dict(self.counts, blocks=len(self._blocks), pinned=len(self._pins))

    def close(self):
        with _lock:
            if not self._closed:
                self._closed = True
                _open_folders.difference_update(self.folders)

    # -- asynchronous API ---------------------------------------------------------------------------------------
    def submit_put(self, keys, blocks):
        return self._submit(self.put, keys, blocks)

    def submit_get(self, keys, out):
        return self._submit(self.get, keys, out)

    def _submit(self, fn, keys, bufs):
        self._check_open()
        keys = _check_keys(keys)
        _rows(bufs, len(keys), self.block_bytes, writable=(fn == self.get))
        fut = Future()

        def run():
            if faults["delay_s"]:
                fut._cancel.wait(faults["delay_s"])
            if fut._cancel.is_set():
                fut._finish([False] * len(keys))
                return
            try:
                fut._finish(fn(keys, bufs))
            except Exception as e:  # noqa: BLE001
                fut._finish(error=e)

        threading.Thread(target=run, daemon=True).start()
        return fut

    def _check_open(self):
        if self._closed:
            raise ValueError("the store is closed")
