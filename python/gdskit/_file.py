"""gdskit.File: an open file that reads into and writes from torch tensors (CPU or CUDA) and numpy arrays."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import stat as _stat
import errno as _errno
import threading

from . import _gdskit
from ._buffers import buffer_of
from ._devices import parse_device

_MODES = ("r", "r+", "w", "w+", "x", "x+")


class IOFuture(concurrent.futures.Future):
    """The byte count of one background read or write, as a concurrent.futures.Future: a batch of one range
    (gdskit.BatchFuture) whose result is the bytes moved, or whose exception is the range's OSError. Awaitable
    (`n = await f.pread(t)`), with fileno() (readable once done) and cancel()."""

    def __init__(self, batch_future):
        super().__init__()
        self._fut = batch_future
        self.set_running_or_notify_cancel()
        batch_future.add_done_callback(self._settle)

    def _settle(self, fut):
        from ._batch import BatchError  # noqa: PLC0415

        try:
            self.set_result(fut.result().nbytes)
        except BatchError as e:
            self.set_exception(e.results[0].error)
        except BaseException as e:  # noqa: BLE001
            self.set_exception(e)

    def get(self, timeout=None) -> int:
        """The byte count (KvikIO's spelling of result())."""
        return self.result(timeout)

    def cancel(self) -> bool:
        """Stops the transfer if it has not completed (result() then raises OSError ECANCELED)."""
        return False if self.done() else self._fut.cancel()

    def fileno(self) -> int:
        return self._fut.fileno()

    def __await__(self):
        return asyncio.wrap_future(self).__await__()


class File:
    """An open file for reads and writes of whole contiguous buffers:

        with gdskit.File("data.bin") as f:
            n = f.read(tensor, offset=4096)        # blocking; the GIL is released while it runs
            fut = f.pread(other, offset=0)         # concurrent.futures.Future, also awaitable
            path, reasons = f.plan(tensor)         # ("staged", [...]) for a CUDA tensor

    mode: "r" (read; regular files only), "r+" (read and write), "w"/"w+" (create or truncate), "x"/"x+"
    (create; the file must not exist). Buffers: contiguous torch tensors on the CPU or a CUDA device, or
    C-contiguous numpy arrays. Errors: OSError subclasses with errno and filename, ValueError/TypeError for bad
    arguments, ValueError for I/O on a closed file."""

    def __init__(self, path, mode: str = "r"):
        if not isinstance(mode, str) or mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}") from None
        self.mode = mode
        if mode != "r":
            _refuse_special(self.path)
        self._handle = _gdskit.FileHandle(self.path, mode)
        self._pending = set()
        self._lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<gdskit.File {self.path!r} mode={self.mode!r}{' closed' if self.closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _open(self):
        handle = self._handle
        if handle is None:
            raise ValueError("I/O operation on a closed gdskit.File")
        return handle

    @property
    def size(self) -> int:
        """The file's current size in bytes."""
        return self._open().size()

    def read(self, buf, offset: int = 0) -> int:
        """Reads buf's nbytes at `offset` into buf; returns the bytes read (fewer only at end of file)."""
        ptr, nbytes, device = buffer_of(buf, writable=True, what="File.read")
        return self._open().read(ptr, nbytes, _offset(offset), device)

    def write(self, buf, offset: int = 0) -> int:
        """Writes all of buf at `offset`; returns its nbytes (a full disk is an error, never a short write)."""
        ptr, nbytes, device = buffer_of(buf, writable=False, what="File.write")
        return self._open().write(ptr, nbytes, _offset(offset), device)

    def pread(self, buf, offset: int = 0) -> IOFuture:
        """read() in the background, as a batch of one range: a future of the byte count (fewer only at end of
        file). The future keeps buf alive until the read has let go of it."""
        from ._batch import submit_reads  # noqa: PLC0415

        return self._track(IOFuture(submit_reads([(self, _offset(offset), buf)], exact=False)))

    def pwrite(self, buf, offset: int = 0) -> IOFuture:
        """write() in the background: a future of the byte count."""
        from ._batch import submit_writes  # noqa: PLC0415

        return self._track(IOFuture(submit_writes([(self, _offset(offset), buf)])))

    def plan(self, target="cpu"):
        """(path, reasons): the data path a read into `target` takes ("gds", "staged", "compat" or "host") and
        why. target: a tensor or array, or a device ("cpu", "cuda:N", N, torch.device). A CUDA target without
        a usable GPU raises OSError(ENODEV) with the reason, as a read would."""
        try:
            device = parse_device(target)
        except TypeError:
            _, _, device = buffer_of(target, writable=False, what="File.plan")
        return tuple(self._open().plan(device))

    def close(self):
        """Waits for the background reads and writes of this file, then closes it. Closing twice is harmless."""
        with self._lock:
            pending, self._pending = list(self._pending), set()
        for fut in pending:
            fut._fut.wait_released()
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def _track(self, fut: IOFuture) -> IOFuture:
        with self._lock:
            self._pending = {f for f in self._pending if not f._fut.released()}
            self._pending.add(fut)
        return fut


def _offset(offset) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, not {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, not {offset}")
    return offset


def _refuse_special(path: str):
    # Opening a FIFO for writing waits for a reader; only regular files and new names are written.
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if _stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), path)
    if not _stat.S_ISREG(st.st_mode):
        raise OSError(_errno.EINVAL, "not a regular file", path)
