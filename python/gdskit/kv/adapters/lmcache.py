"""LMCache L2 storage on a gdskit block store: a client for LMCache's `native_plugin` L2 adapter type.

LMCache (multi-process mode) loads it from its L2 adapter configuration and wraps it in its own native-connector
bridge, which polls `event_fd()` and calls `drain_completions()`:

    --l2-adapter '{"type": "native_plugin",
                   "module_path": "gdskit.kv.adapters.lmcache", "class_name": "GdskitL2Client",
                   "adapter_params": {"path": "/nvme/lmcache", "capacity_gb": 400,
                                      "block_bytes": 4194304, "namespace": "llama-3.1-8b/bf16"}}'

block_bytes is the size of one LMCache chunk in L1 memory (chunk tokens x layers x 2 x KV heads x head size x
element size for a plain attention model); every chunk must have that size (a chunk of another size is a miss
on get and a failed store on set). Leave LMCache's max_capacity_gb at 0: the store enforces its own capacity and
evicts by itself; it has no delete for LMCache to call.

Mapping: every submit is one store batch (submit_get / submit_put), completed by its batch future. event_fd() is
an epoll descriptor over those futures' own descriptors (and one eventfd for operations that complete at once,
such as exists, which is an in-memory lookup): it is readable exactly while a completion waits to be drained.
Misses are not errors: a get completes ok with a per-key hit mask, and buffers of missed keys are untouched.
"""

from __future__ import annotations

import logging
import os
import select
import threading

from ._common import (buffer_array, capacity_from, config_value, open_store, outcome_mask, store_key)

__all__ = ["GdskitL2Client"]

_log = logging.getLogger(__name__)

_GET, _SET = "get", "set"


class _Op:
    """A submitted get or set: the future of the store batch that serves the keys whose buffers fit, and where
    those keys sit in the caller's list."""

    __slots__ = ("future_id", "kind", "n", "future", "positions", "known", "note")

    def __init__(self, future_id, kind, n, future, positions, known, note):
        self.future_id = future_id
        self.kind = kind
        self.n = n
        self.future = future
        self.positions = positions  # caller index of each key in the store batch
        self.known = known          # per caller key: True (already stored), False (refused) or None (in batch)
        self.note = note            # why keys were refused before any I/O ("" if none)

    def completion(self):
        mask = list(self.known)
        error = self.note
        if self.future is not None:
            try:
                got = outcome_mask(self.future.result(), len(self.positions), f"LMCache {self.kind}")
            except Exception as e:  # noqa: BLE001 -- an I/O failure of the batch: its keys failed
                got = [False] * len(self.positions)
                error = error or f"{type(e).__name__}: {e}"
            for pos, ok in zip(self.positions, got):
                mask[pos] = ok
        if self.kind == _GET:
            # A miss is no error; the mask says which buffers were filled.
            return (self.future_id, True, "", [bool(x) for x in mask])
        stored = sum(1 for x in mask if x)
        if stored == self.n:
            return (self.future_id, True, "", None)
        return (self.future_id, False, error or f"{self.n - stored} of {self.n} chunks not stored "
                "(store full of pinned blocks, I/O error or deadline)", None)


class GdskitL2Client:
    """The native client LMCache's native_plugin L2 adapter drives (event_fd, submit_batch_get/set/exists,
    drain_completions, close). Thread-safe: submits may come from several threads while another drains.

    Parameters (LMCache's adapter_params): path (a folder or a list of folders, striped), capacity_bytes or
    capacity_gb, block_bytes (one chunk), namespace (model revision, dtype, layout: blocks stored under another
    namespace are never served), durability ("cache" or "persist"), deadline_s (per operation; keys unfinished
    then are misses). Unknown parameters are a TypeError, as a constructor's would be."""

    def __init__(self, path=None, *, capacity_bytes=None, capacity_gb=None, block_bytes=None, namespace="",
                 durability="cache", deadline_s=2.0):
        where = "LMCache native_plugin adapter_params"
        params = {"path": path, "capacity_bytes": capacity_bytes, "capacity_gb": capacity_gb,
                  "block_bytes": block_bytes, "namespace": namespace, "durability": durability,
                  "deadline_s": deadline_s}
        paths = config_value(params, "path", list, required=True, where=where)
        self._block_bytes = config_value(params, "block_bytes", int, required=True, where=where)
        if self._block_bytes <= 0:
            raise ValueError(f"{where}: 'block_bytes' must be positive")
        self._store = open_store(paths, capacity_bytes=capacity_from(params, where), block_bytes=self._block_bytes,
                                 namespace="lmcache|" + config_value(params, "namespace", str, "", where=where),
                                 durability=config_value(params, "durability", str, "cache", where=where),
                                 deadline_s=config_value(params, "deadline_s", float, 2.0, where=where))
        self._lock = threading.Lock()
        self._next_id = 1
        self._pending = {}   # batch future's fd -> _Op
        self._ready = []     # completions that needed no I/O
        self._closed = False
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._wake, select.EPOLLIN)

    # -- the native client contract --------------------------------------------------------------------

    def event_fd(self) -> int:
        """Readable while completions wait for drain_completions()."""
        self._check_open()
        return self._epoll.fileno()

    def submit_batch_get(self, keys, memoryviews) -> int:
        """Reads the chunks of `keys` into the writable buffers `memoryviews`; returns the future id. The
        buffers must stay alive until drain_completions() has returned that id."""
        return self._submit(_GET, keys, memoryviews)

    def submit_batch_set(self, keys, memoryviews) -> int:
        """Stores the chunks in `memoryviews` under `keys` (keys already stored are not rewritten)."""
        return self._submit(_SET, keys, memoryviews)

    def submit_batch_exists(self, keys) -> int:
        """Which keys are stored (in memory, no I/O); completes at once."""
        skeys = self._keys(keys)
        mask = outcome_mask(self._store.lookup(skeys), len(skeys), "LMCache exists")
        with self._lock:
            self._check_open()
            fid = self._take_id()
            self._ready.append((fid, True, "", mask))
            os.eventfd_write(self._wake, 1)
        return fid

    def drain_completions(self) -> list:
        """Every completion since the last call, as (future_id, ok, error, per-key bools or None)."""
        with self._lock:
            if self._closed:
                return []
            try:
                os.eventfd_read(self._wake)
            except BlockingIOError:
                pass
            out, self._ready = self._ready, []
            done = []
            for fd, _ in self._epoll.poll(0):
                op = self._pending.pop(fd, None)
                if op is not None:
                    self._epoll.unregister(fd)
                    done.append(op)
        # Results are read outside the lock: submits go on meanwhile.
        out.extend(op.completion() for op in sorted(done, key=lambda o: o.future_id))
        return out

    def close(self) -> None:
        """Cancels what is in flight, waits until no request still targets a caller's buffer, and closes the
        store. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = list(self._pending.values()), {}
        for op in pending:
            op.future.cancel()
            try:
                op.future.result()
            except Exception:  # noqa: BLE001 -- cancelled or failed: either way nothing runs any more
                pass
        try:
            self._store.close()
        finally:
            self._epoll.close()
            os.close(self._wake)

    # -- internals ----------------------------------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ValueError("the LMCache gdskit client is closed")

    def _take_id(self) -> int:
        fid = self._next_id
        self._next_id += 1
        return fid

    def _keys(self, keys) -> list:
        if isinstance(keys, (str, bytes)) or not keys:
            raise ValueError("keys must be a non-empty list of strings")
        out = []
        for k in keys:
            if not isinstance(k, str):
                raise TypeError(f"a key must be a string, not {type(k).__name__}")
            out.append(store_key(k))
        return out

    def _submit(self, kind, keys, memoryviews) -> int:
        skeys = self._keys(keys)
        if len(memoryviews) != len(skeys):
            raise ValueError(f"{len(skeys)} keys but {len(memoryviews)} buffers")
        arrays = [buffer_array(mv, writable=(kind == _GET)) for mv in memoryviews]
        known = [None] * len(skeys)
        wrong = [i for i, a in enumerate(arrays) if a.nbytes != self._block_bytes]
        note = ""
        for i in wrong:
            known[i] = False
        if wrong:
            note = (f"{len(wrong)} chunk(s) of {arrays[wrong[0]].nbytes} bytes, not the store's block_bytes "
                    f"{self._block_bytes}")
            _log.warning("LMCache %s: %s", kind, note)
        if kind == _SET:
            # A chunk already stored is not written again.
            present = outcome_mask(self._store.lookup(skeys), len(skeys), "LMCache set")
            for i, p in enumerate(present):
                if p and known[i] is None:
                    known[i] = True
        positions = [i for i, k in enumerate(known) if k is None]
        future = None
        if positions:
            batch_keys = [skeys[i] for i in positions]
            batch_bufs = [arrays[i] for i in positions]
            try:
                future = (self._store.submit_get(batch_keys, batch_bufs) if kind == _GET
                          else self._store.submit_put(batch_keys, batch_bufs))
            except OSError as e:
                # The device refused the batch (EIO, ENOSPC, ...): these keys fail, the store keeps serving.
                for i in positions:
                    known[i] = False
                positions, note = [], note or f"{type(e).__name__}: {e}"
        with self._lock:
            if self._closed:
                if future is not None:
                    future.cancel()
                raise ValueError("the LMCache gdskit client is closed")
            fid = self._take_id()
            op = _Op(fid, kind, len(skeys), future, positions, known, note)
            if future is None:
                self._ready.append(op.completion())
                os.eventfd_write(self._wake, 1)
            else:
                fd = future.fileno()
                self._pending[fd] = op
                self._epoll.register(fd, select.EPOLLIN)
        return fid
