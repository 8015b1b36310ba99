"""gdskit.kv: a KV-cache block store on local disks that never hangs and never returns wrong bytes.

    from gdskit.kv import BlockStore
    store = BlockStore("/nvme/kv", capacity_bytes=200 << 30, block_bytes=2 << 20, namespace="llama-8b/bf16/tp0")
    stored = store.put(keys, blocks)        # keys: bytes (1..32) or ints; blocks: [n, block_bytes] uint8 tensor
    hits = store.get(keys, out)             # rows of `out` are written only for hits
    n = store.prefix(keys)                  # how many leading keys are held (in memory, no I/O)
    future = store.submit_get(keys, out)    # fileno() / await / result(timeout)

Every block is written with a header (key, namespace, sequence, CRC32C of the data) and every read is checked
against it: a block that fails is a miss, never wrong bytes. The store stays within capacity_bytes on disk,
evicts with S3-FIFO (never a pinned block), survives kill -9 (it rebuilds its index at the next open), and ends
every call by its deadline (keys not finished are misses; nothing lands in `out` afterwards). One process opens
a store folder at a time (a second gets OSError EBUSY). docs/kv.md has the on-disk format and the crash model.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import sys
import threading

from .. import _gdskit
from .._batch import _stream_handle
from .._buffers import buffer_of as _buffer_of

__all__ = ["BlockStore", "KVFuture", "capacity_for"]


def _paths(paths) -> list:
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    try:
        out = [os.fsdecode(os.fspath(p)) for p in paths]
    except TypeError:
        raise TypeError("paths must be a folder (str or os.PathLike) or a list of them") from None
    if not out:
        raise ValueError("paths: give at least one folder or block device")
    return out


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{what} must be positive, not {value}")
    return value


def _keys_list(keys) -> list:
    if isinstance(keys, (bytes, bytearray, str, int)):
        raise TypeError(f"keys must be a list of keys (bytes or int), not a single {type(keys).__name__}")
    try:
        return list(keys)
    except TypeError:
        raise TypeError(f"keys must be a list of keys (bytes or int), not {type(keys).__name__}") from None


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _rows(blocks, n: int, block_bytes: int, *, writable: bool, what: str):
    """(addresses of n rows, device) of a [n, block_bytes] uint8 tensor/array or a list of n equally sized
    contiguous tensors/arrays (any dtype, block_bytes each), all on one device."""
    if isinstance(blocks, (list, tuple)):
        if len(blocks) != n:
            raise ValueError(f"{what}: {len(blocks)} rows for {n} keys")
        ptrs, device = [], None
        for i, b in enumerate(blocks):
            ptr, nbytes, dev = _buffer_of(b, writable=writable, what=f"{what}[{i}]")
            if nbytes != block_bytes:
                raise ValueError(f"{what}[{i}] is {nbytes} bytes; the store's blocks are {block_bytes} bytes")
            if device is not None and dev != device:
                raise ValueError(f"{what}: rows on several devices ({_dev(device)} and {_dev(dev)}); "
                                 "one call moves rows of one device")
            device = dev
            ptrs.append(ptr)
        return ptrs, (-1 if device is None else device)
    shape = getattr(blocks, "shape", None)
    if shape is None:
        raise TypeError(f"{what}: pass a [n, block_bytes] uint8 tensor or array, or a list of tensors/arrays, "
                        f"not {type(blocks).__name__}")
    dtype = str(getattr(blocks, "dtype", ""))
    if dtype not in ("torch.uint8", "uint8"):
        hint = ".view(torch.uint8)" if _is_tensor(blocks) else ".view(numpy.uint8)"
        raise TypeError(f"{what}: a tensor of blocks must be uint8 with shape [n, block_bytes], not {dtype} "
                        f"(reinterpret it with {hint}, or pass a list of tensors)")
    if len(shape) != 2 or shape[1] != block_bytes:
        raise ValueError(f"{what}: shape {tuple(shape)}; the store needs [n, {block_bytes}]")
    if writable and shape[0] < n:
        raise ValueError(f"{what}: {shape[0]} rows are too few for {n} keys")
    if not writable and shape[0] != n:
        raise ValueError(f"{what}: {shape[0]} rows for {n} keys")
    ptr, _, device = _buffer_of(blocks, writable=writable, what=what)
    return [ptr + i * block_bytes for i in range(n)], device


def _dev(d: int) -> str:
    return "cpu" if d < 0 else f"cuda:{d}"




def capacity_for(blocks: int, block_bytes: int, paths: int = 1) -> int:
    """The capacity_bytes a BlockStore needs to hold `blocks` blocks of `block_bytes` over `paths` folders:
    every block takes its size rounded up to 4 KiB plus a 4 KiB header, and each folder holds the store's
    superblock and two copies of its index."""
    return _gdskit.kv_capacity_for(_count(blocks, "blocks"), _count(block_bytes, "block_bytes"),
                                   _count(paths, "paths"))


class KVFuture:
    """A submitted put or get: result(timeout=None) -> [bool per key], done(), cancel(), fileno() (an eventfd
    readable once done), errors() -> [errno per key, 0 when ok], and `await future` inside asyncio."""

    def __init__(self, inner):
        self._inner = inner

    def done(self) -> bool:
        return self._inner.done()

    def cancel(self) -> bool:
        """Stops the operation: keys not finished become misses (ECANCELED). False when it had already ended."""
        return self._inner.cancel()

    def cancelled(self) -> bool:
        return self.done() and _errno.ECANCELED in self._inner.outcome()[1]

    def running(self) -> bool:
        return not self.done()

    def fileno(self) -> int:
        """An eventfd that is readable once the operation has ended (and stays readable). Do not read or close it."""
        return self._inner.fileno()

    def result(self, timeout=None) -> list:
        """Per key: True for a hit (get) or stored key (put). TimeoutError when not done within timeout seconds."""
        if timeout is not None and not self._inner.wait(float(timeout)):
            raise TimeoutError(f"the block store operation did not end within {timeout} s")
        return self._inner.outcome()[0]

    def errors(self, timeout=None) -> list:
        """Per key: 0 when ok, else the errno (ENOENT not held, EBADMSG failed its check, ETIMEDOUT, ECANCELED,
        ENOSPC, EIO, EAGAIN not admitted yet)."""
        if timeout is not None and not self._inner.wait(float(timeout)):
            raise TimeoutError(f"the block store operation did not end within {timeout} s")
        return self._inner.outcome()[1]

    def exception(self, timeout=None):
        self.result(timeout)
        return None

    def add_done_callback(self, fn) -> None:
        """Calls fn(self) once done: at once when it is, else from a helper thread that waits for it."""
        if self.done():
            fn(self)
            return
        threading.Thread(target=lambda: (self._inner.wait(None), fn(self)), daemon=True).start()

    def __await__(self):
        if not self.done():
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            fd = self.fileno()

            def ready():
                loop.remove_reader(fd)
                if not waiter.done():
                    waiter.set_result(None)

            loop.add_reader(fd, ready)
            try:
                yield from waiter.__await__()
            finally:
                loop.remove_reader(fd)
        return self._inner.outcome()[0]


class BlockStore:
    """A block store over one or more folders (or whole block devices), striped by key.

    capacity_bytes: most bytes it occupies on disk, all paths together. block_bytes: the size of every block.
    namespace: part of every key's identity (model revision, dtype, layout, rank); a folder holding a store of
    another namespace, block size or capacity is refused (FileExistsError), never reused.
    durability: "cache" (never syncs) or "persist" (a put returns True once data and header are synced).
    deadline_s: every call ends within this many seconds; unfinished keys are misses (or not stored).
    admission: "always", or "second_hit" (a key is stored the second time it is put).
    preallocate: reserve the whole capacity on disk when the store is made (a disk too small is refused at once);
    False: files grow as blocks are written.
    """

    def __init__(self, paths, *, capacity_bytes, block_bytes, namespace: str = "", durability: str = "cache",
                 deadline_s: float = 2.0, admission: str = "always", preallocate: bool = True):
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)):
            raise TypeError(f"deadline_s must be a number of seconds, not {type(deadline_s).__name__}")
        self._block_bytes = _count(block_bytes, "block_bytes")
        self._store = _gdskit.KVStore(_paths(paths), _count(capacity_bytes, "capacity_bytes"), self._block_bytes,
                                      namespace, durability, float(deadline_s), admission, bool(preallocate))

    @property
    def block_bytes(self) -> int:
        return self._block_bytes

    @property
    def closed(self) -> bool:
        return self._store.closed

    def put(self, keys, blocks, *, deadline_s=None) -> list:
        """Stores blocks[i] under keys[i]; per key True when stored (or already held). The blocks are copied
        before it returns. False for a key the disk had no room for (ENOSPC), a device error, the deadline."""
        keys = _keys_list(keys)
        ptrs, device = _rows(blocks, len(keys), self._block_bytes, writable=False, what="blocks")
        return self._store.put(keys, ptrs, device, deadline_s)[0]

    def get(self, keys, out, *, deadline_s=None) -> list:
        """Reads the blocks of `keys` into the rows of `out`; per key True for a hit. Only rows of hits are
        written, and none after it returns."""
        keys = _keys_list(keys)
        ptrs, device = _rows(out, len(keys), self._block_bytes, writable=True, what="out")
        return self._store.get(keys, ptrs, device, deadline_s)[0]

    def put_detailed(self, keys, blocks, *, deadline_s=None):
        """put() that also returns why each key was not stored: ([bool], [errno or 0])."""
        keys = _keys_list(keys)
        ptrs, device = _rows(blocks, len(keys), self._block_bytes, writable=False, what="blocks")
        return self._store.put(keys, ptrs, device, deadline_s)

    def get_detailed(self, keys, out, *, deadline_s=None):
        """get() that also returns why each key missed: ([bool], [errno or 0])."""
        keys = _keys_list(keys)
        ptrs, device = _rows(out, len(keys), self._block_bytes, writable=True, what="out")
        return self._store.get(keys, ptrs, device, deadline_s)

    def submit_put(self, keys, blocks, *, stream=None, deadline_s=None) -> KVFuture:
        """put() in the background; returns once the writes are under way. The blocks must not change until the
        future is done. stream: a torch.cuda.Stream (or CUstream handle) whose queued work writes the blocks:
        they are read once the stream has reached this call (the host does not wait for it)."""
        keys = _keys_list(keys)
        ptrs, device = _rows(blocks, len(keys), self._block_bytes, writable=False, what="blocks")
        return KVFuture(self._store.submit(False, keys, ptrs, device, (keys, blocks), deadline_s,
                                           _stream_handle(stream)))

    def submit_get(self, keys, out, *, stream=None, deadline_s=None) -> KVFuture:
        """get() in the background; returns once the reads are under way. stream: a torch.cuda.Stream (or
        CUstream handle): work queued on it after this call waits, on the GPU, until the hits have landed in
        `out` (blocks over 8 MiB: this call returns once they have)."""
        keys = _keys_list(keys)
        ptrs, device = _rows(out, len(keys), self._block_bytes, writable=True, what="out")
        return KVFuture(self._store.submit(True, keys, ptrs, device, (keys, out), deadline_s,
                                           _stream_handle(stream)))

    def lookup(self, keys) -> list:
        """Per key: whether it is held (in memory, no I/O)."""
        return self._store.lookup(_keys_list(keys))

    def prefix(self, keys) -> int:
        """How many leading keys are held (in memory, no I/O)."""
        return self._store.prefix(_keys_list(keys))

    def pin(self, keys) -> list:
        """Keeps held keys from eviction until unpinned (pins count; they end at close). Per key: pinned."""
        return self._store.pin(_keys_list(keys))

    def unpin(self, keys) -> None:
        self._store.unpin(_keys_list(keys))

    def stats(self) -> dict:
        """Counters since open (keys, bytes), the state now (blocks, pinned, physical_bytes), how the store was
        found at open (recovery), and the path blocks take (path, path_reasons, direct, direct_reason)."""
        return self._store.stats()

    def close(self) -> None:
        """Waits for operations in flight, writes an index checkpoint and releases the folder. Idempotent."""
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._block_bytes}-byte blocks"
        return f"<gdskit.kv.BlockStore {state}>"
