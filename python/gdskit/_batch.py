"""Batches: many (file, offset, buffer) items read or written as one submission, and row gathers.

    res = gdskit.read_into([("a.bin", 0, t1), (f, 4096, t2)], deadline_s=0.5)   # BatchError if any item failed
    fut = gdskit.submit_reads(items)                # BatchFuture: result(timeout), done(), cancel(), fileno(), await
    rows = gdskit.gather_rows("emb.npy", idx, device="cuda:0")   # == numpy.load(path, mmap_mode="r")[idx]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno as _errno
import operator
import os
import select
import sys
import threading
from collections.abc import Sequence
from typing import NamedTuple

from . import _gdskit
from ._buffers import buffer_of
from ._devices import parse_device

__all__ = ["read_into", "write_from", "submit_reads", "submit_writes", "BatchFuture", "BatchResult", "BatchError",
           "ItemResult", "gather_rows", "RowFile"]


class ItemResult(NamedTuple):
    """One item's outcome: the bytes moved, and None or the OSError that ended it."""

    nbytes: int
    error: OSError | None

    @property
    def ok(self) -> bool:
        return self.error is None


class BatchResult(Sequence):
    """Every item's outcome, in the order the items were given. `nbytes`: bytes moved in all; `failed`: how many
    items failed; `seconds`: from submission to completion; `routes`: how many items took each path (host,
    staged, gds), the file requests issued and how many of them went through the page cache (buffered)."""

    def __init__(self, raw, paths):
        items, self.nbytes, self.failed, self.seconds, self.routes = raw
        self._items = items
        self._paths = paths

    def __len__(self):
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        nbytes, code, message = self._items[i]
        if code == 0:
            return ItemResult(nbytes, None)
        return ItemResult(nbytes, _os_error(code, message, self._paths[i] if self._paths else None))

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def errors(self):
        """[(index, OSError)] of the items that failed."""
        return [(i, self[i].error) for i, (_, code, _) in enumerate(self._items) if code != 0]

    def __repr__(self):
        return f"<gdskit.BatchResult items={len(self)} failed={self.failed} nbytes={self.nbytes}>"


# The largest offset a file has (off_t): ranges reaching past it are refused before any I/O.
_MAX_OFFSET = (1 << 63) - 1


class BatchError(OSError):
    """Some items of a batch failed. `results` holds every item's outcome (a BatchResult); `failed` the indices
    of the failed items. errno, strerror and filename are those of the first failed item."""

    def __init__(self, results: BatchResult):
        errs = results.errors()
        first_index, first = errs[0]
        super().__init__(first.errno, f"{len(errs)} of {len(results)} items failed; item {first_index}: "
                                      f"{first.strerror}", first.filename)
        self.results = results
        self.failed = [i for i, _ in errs]


def _os_error(code: int, message: str, path):
    # The OSError subclass Python gives this errno (TimeoutError for ETIMEDOUT, ...), with the path.
    return OSError(code, message, path) if path is not None else OSError(code, message)


# ---- items -------------------------------------------------------------------------------------------------------

def _memory(buf, *, writable: bool, what: str):
    """(address, nbytes, device, holder) of a tensor, an array, an object with __cuda_array_interface__ or a
    buffer (memoryview, bytearray, bytes); `holder` must stay alive while the address is used."""
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None and not hasattr(buf, "data_ptr"):
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ValueError(f"{what}: the GPU array is read-only")
        if cai.get("strides") is not None:
            raise ValueError(f"{what}: the GPU array must be C-contiguous")
        nbytes = int(getattr(buf, "nbytes", 0))
        device = getattr(getattr(buf, "device", None), "id", 0)
        return ptr, nbytes, int(device), buf
    try:
        ptr, nbytes, device = buffer_of(buf, writable=writable, what=what)
        return ptr, nbytes, device, buf
    except TypeError:
        pass
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"{what}: pass a torch.Tensor, a numpy array, or a buffer (memoryview, bytearray, bytes), "
                        f"not {type(buf).__name__}") from None
    if writable and view.readonly:
        raise ValueError(f"{what}: the buffer is read-only")
    if not view.c_contiguous:
        raise ValueError(f"{what}: the buffer must be C-contiguous")
    if view.nbytes == 0:
        return 0, 0, -1, view
    import ctypes  # noqa: PLC0415

    if not view.readonly:
        # Holds the buffer exported (a bytearray cannot be resized under the batch) while it is alive.
        holder = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
        return ctypes.addressof(holder), view.nbytes, -1, holder
    try:
        import numpy as np  # noqa: PLC0415
    except ImportError:
        np = None
    if np is not None:
        arr = np.frombuffer(view, dtype=np.uint8)
        return arr.ctypes.data, view.nbytes, -1, arr
    if isinstance(view.obj, bytes) and view.nbytes == len(view.obj):
        return ctypes.cast(ctypes.c_char_p(view.obj), ctypes.c_void_p).value, view.nbytes, -1, view.obj
    raise TypeError(f"{what}: a read-only buffer other than bytes needs numpy; pass a bytearray")


def _naming_item(e: Exception, what: str, i: int) -> Exception:
    """`e` again (same type, errno and file name) with the item it came from in its message."""
    try:
        if isinstance(e, OSError) and e.errno is not None:
            return type(e)(e.errno, f"{what}: item {i}: {e.strerror}", e.filename)
        return type(e)(f"{what}: item {i}: {e}")
    except Exception:  # noqa: BLE001 - an exception type that takes other arguments: kept as it is
        return e


def _prepare(items, write: bool):
    """Opens the items' files (once per path) and takes their memory; TypeError/ValueError naming the item."""
    from ._file import File  # noqa: PLC0415

    handles, by_key, keep = [], {}, []
    which, offsets, ptrs, sizes, devices, paths = [], [], [], [], [], []
    opened, created = [], []
    what = "write_from" if write else "read_into"
    try:
        for i, item in enumerate(items):
            try:
                file, offset, buf = item
            except (TypeError, ValueError):
                raise TypeError(f"{what}: item {i} must be (file, offset, buffer)") from None
            if isinstance(offset, bool) or not hasattr(offset, "__index__"):
                raise TypeError(f"{what}: item {i}: offset must be an int, not {type(offset).__name__}")
            offset = operator.index(offset)
            if offset < 0:
                raise ValueError(f"{what}: item {i}: offset must be >= 0, not {offset}")
            if offset > _MAX_OFFSET:
                raise _gdskit.InvalidArgumentError(
                    _errno.EINVAL, f"{what}: item {i}: offset {offset} is past the largest file offset (2**63 - 1)")
            if isinstance(file, File):
                key = ("file", id(file))
                if key not in by_key:
                    try:
                        handles.append(file._open())
                    except (OSError, ValueError) as e:  # closed, or a file of the wrong mode
                        raise _naming_item(e, what, i) from e
                    by_key[key] = len(handles) - 1
                    keep.append(file)
                path = file.path
            else:
                try:
                    path = os.fspath(file)
                except TypeError:
                    raise TypeError(f"{what}: item {i}: file must be a path or a gdskit.File, "
                                    f"not {type(file).__name__}") from None
                key = ("path", path)
                if key not in by_key:
                    # A path to write is created when missing and never truncated.
                    mode = ("r+" if os.path.exists(path) else "x+") if write else "r"
                    try:
                        f = File(path, mode)
                    except (OSError, ValueError) as e:  # missing, a FIFO or device, a folder, no permission
                        raise _naming_item(e, what, i) from e
                    opened.append(f)
                    if mode == "x+":
                        created.append(path)
                    by_key[key] = len(handles)
                    handles.append(f._open())
            ptr, nbytes, device, holder = _memory(buf, writable=not write, what=f"{what}: item {i}")
            which.append(by_key[key])
            offsets.append(offset)
            ptrs.append(ptr)
            sizes.append(nbytes)
            devices.append(device)
            paths.append(path)
            keep.append(holder)
    except BaseException:
        _discard(opened, created)
        raise
    return handles, which, offsets, ptrs, sizes, devices, paths, keep, opened, created


def _discard(opened, created):
    """Closes the files a refused batch opened. A batch refused before any I/O leaves nothing behind: the files
    it made for its writes go too (while still empty, as it made them)."""
    for f in opened:
        f.close()
    for path in created:
        try:
            if os.path.getsize(path) == 0:
                os.unlink(path)
        except OSError:
            pass


def _stream_handle(stream) -> int:
    if stream is None:
        return 0
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not hasattr(handle, "__index__"):
        raise TypeError(f"stream must be a torch.cuda.Stream or a CUstream handle (int), not {type(stream).__name__}")
    return operator.index(handle)


def _deadline(deadline_s):
    if deadline_s is None:
        return None
    try:
        value = float(deadline_s)
    except (TypeError, ValueError):
        raise TypeError(f"deadline_s must be a number of seconds, not {type(deadline_s).__name__}") from None
    if not value >= 0:
        raise ValueError(f"deadline_s must be >= 0, not {deadline_s!r}")
    return value


def _submit(items, write, deadline_s, queue_depth, exact, coalesce_gap_bytes, stream):
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 0:
        raise ValueError(f"queue_depth must be an int >= 0, not {queue_depth!r}")
    deadline = _deadline(deadline_s)
    handles, which, offsets, ptrs, sizes, devices, paths, keep, opened, created = _prepare(items, write)
    try:
        batch = _gdskit.submit_batch(write, handles, which, offsets, ptrs, sizes, devices, deadline, queue_depth,
                                     exact, coalesce_gap_bytes, _stream_handle(stream))
    except BaseException:
        _discard(opened, created)
        raise
    return batch, paths, keep, opened


# ---- futures -----------------------------------------------------------------------------------------------------

class _Completions:
    """One daemon thread per process that waits (GIL released, no polling) on the event descriptors of every
    pending BatchFuture and completes each as its batch does."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = {}
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._thread = threading.Thread(target=self._run, name="gdskit-batch-completions", daemon=True)
        self._thread.start()

    def add(self, fut: "BatchFuture"):
        fd = fut._batch.fileno()
        with self._lock:
            self._pending[fd] = fut
        self._epoll.register(fd, select.EPOLLIN)

    def _run(self):
        while True:
            try:
                events = self._epoll.poll()
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    fut = self._pending.pop(fd, None)
                try:
                    self._epoll.unregister(fd)
                except (OSError, ValueError):
                    pass
                if fut is not None:
                    fut._complete()


_completions = None
_completions_lock = threading.Lock()


def _completion_thread() -> _Completions:
    global _completions
    with _completions_lock:
        if _completions is None:
            _completions = _Completions()
        return _completions


class BatchFuture(concurrent.futures.Future):
    """A submitted batch: a concurrent.futures.Future of its BatchResult (result() raises BatchError when any
    item failed), also awaitable (`res = await fut`), with fileno() for event loops (readable once the batch is
    done), cancel() (items not finished complete with ECANCELED) and released() (nothing of the batch still
    touches the buffers: after a deadline or cancel, requests the kernel already held may still be running)."""

    def __init__(self, batch, paths, keep, opened):
        super().__init__()
        self._batch = batch
        self._paths = paths
        self._keep = keep        # the buffers and files: alive until the batch is released
        self._opened = opened    # files opened for this batch by path: closed once it is released
        self.set_running_or_notify_cancel()
        _completion_thread().add(self)

    def _complete(self):
        try:
            res = BatchResult(self._batch.result(), self._paths)
        except BaseException as e:  # noqa: BLE001
            self.set_exception(e)
            return
        if res.ok:
            self.set_result(res)
        else:
            self.set_exception(BatchError(res))
        if self._batch.released():
            self._let_go()

    def _let_go(self):
        for f in self._opened:
            f.close()
        self._opened = []
        self._keep = None

    def fileno(self) -> int:
        """An event descriptor, readable once the batch is done (and for good)."""
        return self._batch.fileno()

    def cancel(self) -> bool:
        """Stops the batch: items not yet finished complete with ECANCELED (result() then raises BatchError).
        False when the batch had already completed."""
        if self.done():
            return False
        return bool(self._batch.cancel())

    def released(self) -> bool:
        return bool(self._batch.released())

    def wait_released(self):
        """Blocks until no request of the batch still touches its buffers."""
        self._batch.wait_released()
        self._let_go()

    def __await__(self):
        return asyncio.wrap_future(self).__await__()

    def __del__(self):
        # The buffers must outlive every request that targets them: a future dropped early waits here.
        batch = getattr(self, "_batch", None)
        if batch is not None and not batch.released():
            batch.wait_released()


def submit_reads(items, *, deadline_s=None, queue_depth: int = 0, exact: bool = True, coalesce_gap_bytes=None,
                 stream=None) -> BatchFuture:
    """Reads every item (file, offset, buffer) — file a path or a gdskit.File, buffer a writable tensor, array
    or buffer on any device whose whole nbytes is read — and returns a BatchFuture at once.
    deadline_s: seconds from now after which unfinished items complete with ETIMEDOUT. queue_depth: requests in
    flight (0: the device's scheduler decides). exact: an item cut short by the end of its file fails with
    ENODATA (False: it succeeds with fewer bytes). stream: a torch.cuda.Stream (or CUstream handle) whose later
    work waits, on the GPU, until the bytes have landed. Bad items raise before any I/O (TypeError, ValueError,
    or OSError naming the item)."""
    return BatchFuture(*_submit(items, False, deadline_s, queue_depth, exact, coalesce_gap_bytes, stream))


def submit_writes(items, *, deadline_s=None, queue_depth: int = 0, stream=None) -> BatchFuture:
    """Writes every item (file, offset, buffer) — all of each buffer at its offset; a path is created if missing
    and never truncated — and returns a BatchFuture at once. stream: the writes start once the stream has
    reached this point (work queued on it before has finished writing the buffers)."""
    return BatchFuture(*_submit(items, True, deadline_s, queue_depth, True, 0, stream))


def _blocking(items, write, deadline_s, queue_depth, exact, coalesce_gap_bytes) -> BatchResult:
    batch, paths, keep, opened = _submit(items, write, deadline_s, queue_depth, exact, coalesce_gap_bytes, None)
    try:
        res = BatchResult(batch.result(), paths)
        batch.wait_released()
    finally:
        for f in opened:
            f.close()
    del keep
    if not res.ok:
        raise BatchError(res)
    return res


def read_into(items, *, deadline_s=None, queue_depth: int = 0, exact: bool = True,
              coalesce_gap_bytes=None) -> BatchResult:
    """Reads every item (file, offset, buffer) into its buffer and returns the BatchResult; raises BatchError (an
    OSError holding every item's outcome) when any item failed. Arguments as submit_reads."""
    return _blocking(items, False, deadline_s, queue_depth, exact, coalesce_gap_bytes)


def write_from(items, *, deadline_s=None, queue_depth: int = 0) -> BatchResult:
    """Writes every item (file, offset, buffer) and returns the BatchResult; raises BatchError when any item
    failed. Arguments as submit_writes."""
    return _blocking(items, True, deadline_s, queue_depth, True, 0)


# ---- row gathers --------------------------------------------------------------------------------------------------

class RowFile:
    """A raw file of fixed-size rows: `dtype` (a numpy or torch dtype, or a numpy type string), `row_shape` (the
    shape of one row), starting at byte `offset`. The row count is what the file holds."""

    def __init__(self, path, dtype, row_shape=(), offset: int = 0):
        self.path = os.fspath(path)
        self.descr, self.itemsize = _descr_of(dtype)
        try:
            self.row_shape = tuple(operator.index(d) for d in (row_shape if isinstance(row_shape, tuple | list)
                                                                else (row_shape,)))
        except TypeError:
            raise TypeError("row_shape must be a tuple of ints") from None
        if any(d < 0 for d in self.row_shape):
            raise ValueError(f"row_shape must not be negative: {self.row_shape}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, not {offset!r}")
        self.offset = offset

    def __repr__(self):
        return f"RowFile({self.path!r}, {self.descr!r}, {self.row_shape}, offset={self.offset})"


def _descr_of(dtype):
    """(numpy type string, itemsize) for a numpy dtype, a torch dtype or a type string; which types a row file can
    hold, and their sizes, are the compiled module's (npy_type, npy_descr_of_torch)."""
    if isinstance(dtype, str):
        text = dtype
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(dtype, torch.dtype):
            text = _gdskit.npy_descr_of_torch(str(dtype).split(".")[-1])
            if text is None:
                raise TypeError(f"torch dtype {dtype} has no numpy equivalent")
        else:
            try:
                import numpy as np  # noqa: PLC0415
            except ImportError:
                raise TypeError(f"dtype must be a type string such as '<f4' without numpy, not {dtype!r}") from None
            text = np.dtype(dtype).str
    known = _gdskit.npy_type(text)
    if known is None:
        # Another spelling numpy knows ("float32", "f4", "int"): its type string.
        try:
            import numpy as np  # noqa: PLC0415
            known = _gdskit.npy_type(np.dtype(text).str)
        except Exception:  # noqa: BLE001
            known = None
    if known is None:
        raise TypeError(f"dtype {dtype!r} is not a plain numeric numpy type")
    return known[0], known[1]


def _indices(indices, nrows: int):
    """int64 indices (numpy semantics: negatives count from the end), checked: IndexError before any I/O."""
    try:
        import numpy as np  # noqa: PLC0415
    except ImportError:
        np = None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy() if np is not None else indices.tolist()
    if np is not None:
        idx = np.asarray(indices)
        if idx.dtype == object:  # integers past 64 bits: checked one by one below
            indices, np = idx.reshape(-1).tolist(), None
    if np is not None:
        if idx.dtype == bool:
            raise IndexError("boolean masks are not row indices: pass numpy.flatnonzero(mask)")
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"indices must be integers, not {idx.dtype}")
        idx = idx.reshape(-1)
        if idx.dtype.kind == "u" and idx.size:
            # Checked before the conversion to int64, which would wrap the largest into negative indices.
            big = idx >= nrows
            if big.any():
                raise IndexError(f"index {int(idx[np.flatnonzero(big)[0]])} is out of bounds for axis 0 with size {nrows}")
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        bad = (idx < -nrows) | (idx >= nrows)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise IndexError(f"index {int(idx[k])} is out of bounds for axis 0 with size {nrows}")
        idx = np.where(idx < 0, idx + nrows, idx)
        return idx, idx.ctypes.data, idx.size
    import array  # noqa: PLC0415

    out = array.array("q")
    for k, v in enumerate(indices):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise IndexError(f"indices must be integers: position {k} holds {type(v).__name__}")
        v = operator.index(v)
        if not -nrows <= v < nrows:
            raise IndexError(f"index {v} is out of bounds for axis 0 with size {nrows}")
        out.append(v + nrows if v < 0 else v)
    return out, out.buffer_info()[0], len(out)


def gather_rows(source, indices, *, device="cpu", out=None, deadline_s=None, queue_depth: int = 0):
    """Rows `indices` (any order, duplicates and negative indices as numpy allows) of a C-order .npy file (rows:
    the first axis) or of a gdskit.RowFile, as one tensor on `device`: byte-identical to
    numpy.load(path, mmap_mode="r")[indices]. Returns a torch tensor when torch is installed, else a numpy
    array (host memory). out: a preallocated contiguous tensor or array of shape (len(indices), *row_shape) and
    the same item size, on the device it should be read to. Out-of-range indices raise IndexError before any I/O;
    failed reads raise BatchError."""
    from ._file import File  # noqa: PLC0415

    if isinstance(source, RowFile):
        f = File(source.path, "r")
        try:
            size = f.size
            row_bytes = source.itemsize
            for d in source.row_shape:
                row_bytes *= d
            if row_bytes == 0:
                raise ValueError("rows of 0 bytes")
            nrows = max(0, size - source.offset) // row_bytes
            descr, row_shape, data_offset = source.descr, source.row_shape, source.offset
        except BaseException:
            f.close()
            raise
    else:
        f = File(source, "r")
        try:
            descr, shape, data_offset, itemsize = _gdskit.read_npy_header(f._open())
            if not shape:
                raise ValueError(f"{f.path}: a 0-d array has no rows")
            nrows, row_shape = shape[0], tuple(shape[1:])
            row_bytes = itemsize
            for d in row_shape:
                row_bytes *= d
        except BaseException:
            f.close()
            raise
    try:
        idx, idx_ptr, count = _indices(indices, nrows)
        result, dev = _output(out, device, descr, (count, *row_shape), count * row_bytes)
        ptr, nbytes, _, _holder = _memory(result, writable=True, what="gather_rows: out")
        if nbytes < count * row_bytes:
            raise ValueError(f"gather_rows: out holds {nbytes} bytes; {count} rows need {count * row_bytes}")
        raw = _gdskit.gather_rows(f._open(), data_offset, row_bytes, nrows, idx_ptr, count, ptr, nbytes, dev,
                                  _deadline(deadline_s), queue_depth)
        del idx
        res = BatchResult(raw, None)
        if not res.ok:
            raise BatchError(res)
        return result
    finally:
        f.close()


def _output(out, device, descr, shape, nbytes):
    """The destination: `out` checked, or a new tensor (torch) or array (numpy) of the rows' dtype."""
    if out is not None:
        _, n, dev, _ = _memory(out, writable=True, what="gather_rows: out")
        if n != nbytes:
            raise ValueError(f"gather_rows: out holds {n} bytes; the rows are {nbytes} bytes ({shape}, {descr})")
        return out, dev
    dev = parse_device(device)
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            torch = None
    known = _gdskit.npy_type(descr)  # with torch's dtype for the rows, or None
    if torch is not None and known is not None and known[2] is not None:
        t = torch.empty(shape, dtype=getattr(torch, known[2]), device="cpu" if dev < 0 else f"cuda:{dev}")
        return t, dev
    if dev >= 0:
        raise ValueError(f"gather_rows: dtype {descr!r} into GPU memory needs torch with that dtype, or out=")
    import numpy as np  # noqa: PLC0415
    return np.empty(shape, dtype=np.dtype(descr)), -1
