"""gdskit.File: an open file that reads into and writes from torch tensors (CPU or CUDA) and numpy arrays."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading

from . import _gdskit
from ._buffers import buffer_of
from ._devices import parse_device


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
    """An open file for reads and writes of contiguous buffers, with KvikIO's CuFile arguments:

        with gdskit.File("data.bin", "rb") as f:
            n = f.read(tensor, file_offset=4096)          # blocking; the GIL is released while it runs
            n = f.read(tensor, 1024, 4096)                # 1024 bytes at 4096 into the start of tensor
            fut = f.pread(other)                          # concurrent.futures.Future, also awaitable
            path, reasons = f.plan(tensor)                # ("staged", [...]) for a CUDA tensor

    mode: "r" (read; regular files only), "r+" (read and write an existing file), "w"/"w+" (create or
    truncate), "x"/"x+" (create; the file must not exist); a "b" anywhere is accepted and changes nothing
    ("rb", "r+b", "wb", "xb", ...). "a" (append) and "t" (text) are refused: reads and writes go to explicit
    offsets, in raw bytes. Buffers: contiguous torch tensors on the CPU or a CUDA device, or C-contiguous numpy
    arrays. Errors: OSError subclasses with errno and filename, ValueError/TypeError for bad arguments,
    ValueError for I/O on a closed file."""

    def __init__(self, path, mode: str = "r"):
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a str such as \"rb\" or \"w+b\", not {type(mode).__name__}")
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}") from None
        # The mode is parsed, and special files refused, in the compiled module.
        self._handle = _gdskit.FileHandle(self.path, mode)
        self.mode = mode
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

    def read(self, buf, *args, **kwargs) -> int:
        """read(buf, size=None, file_offset=0, task_size=None): reads `size` bytes (all of buf when None) at
        `file_offset` into the start of buf; returns the bytes read (fewer only at end of file). The
        arguments are KvikIO's; offset= is file_offset's older name. task_size is accepted and ignored (the
        scheduler sizes requests). A second positional argument alone is refused (see _io_args)."""
        ptr, nbytes, device, offset = _io_args("read", buf, True, args, kwargs)
        return self._open().read(ptr, nbytes, offset, device)

    def write(self, buf, *args, **kwargs) -> int:
        """write(buf, size=None, file_offset=0, task_size=None): writes the first `size` bytes of buf (all of it
        when None) at `file_offset`; returns that count (a full disk is an error, never a short write)."""
        ptr, nbytes, device, offset = _io_args("write", buf, False, args, kwargs)
        return self._open().write(ptr, nbytes, offset, device)

    def pread(self, buf, *args, **kwargs) -> IOFuture:
        """read() in the background (same arguments), as a batch of one range: a future of the byte count
        (fewer only at end of file). The future keeps buf alive until the read has let go of it."""
        from ._batch import submit_reads  # noqa: PLC0415

        view, offset = _io_view("pread", buf, True, args, kwargs)
        return self._track(IOFuture(submit_reads([(self, offset, view)], exact=False)))

    def pwrite(self, buf, *args, **kwargs) -> IOFuture:
        """write() in the background (same arguments): a future of the byte count."""
        from ._batch import submit_writes  # noqa: PLC0415

        view, offset = _io_view("pwrite", buf, False, args, kwargs)
        return self._track(IOFuture(submit_writes([(self, offset, view)])))

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


_IO_NAMES = ("size", "file_offset", "task_size")


def _io_args(what, buf, writable, args, kwargs):
    """(address, nbytes, device, file offset) for File.read/write/pread/pwrite, from KvikIO's arguments
    (buf, size=None, file_offset=0, task_size=None) and the keyword offset= (file_offset's older name).

    A second positional argument without a third is refused: KvikIO reads `f.read(buf, n)` as n bytes at offset
    0, while gdskit's first File API read it as all of buf at offset n, so either reading would silently move
    other bytes for code written for the other one. size=n or file_offset=n says which."""
    if len(args) > len(_IO_NAMES):
        raise TypeError(f"File.{what}() takes at most {len(_IO_NAMES) + 1} positional arguments "
                        f"({len(args) + 1} given)")
    if len(args) == 1 and args[0] is not None:
        raise TypeError(f"File.{what}(buf, {args[0]!r}) is ambiguous: KvikIO reads a lone second argument as the "
                        f"size, earlier gdskit as the file offset. Write File.{what}(buf, size={args[0]!r}) or "
                        f"File.{what}(buf, file_offset={args[0]!r})")
    given = dict(zip(_IO_NAMES, args))
    for key, value in kwargs.items():
        if key not in _IO_NAMES and key != "offset":
            raise TypeError(f"File.{what}() got an unexpected keyword argument {key!r}")
        if key in given:
            raise TypeError(f"File.{what}() got multiple values for argument {key!r}")
        given[key] = value
    if "offset" in given and "file_offset" in given:
        raise TypeError(f"File.{what}(): pass file_offset or offset (its older name), not both")
    offset = _count(given.get("file_offset", given.get("offset", 0)), "file_offset")
    task_size = given.get("task_size")
    if task_size is not None and _count(task_size, "task_size") == 0:
        raise ValueError("task_size must be positive")
    ptr, nbytes, device = buffer_of(buf, writable=writable, what=f"File.{what}")
    size = given.get("size")
    if size is not None:
        size = _count(size, "size")
        if size > nbytes:
            raise ValueError(f"File.{what}: size {size} exceeds the buffer's {nbytes} bytes")
        nbytes = size
    return ptr, nbytes, device, offset


def _count(value, what) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    value = value.__index__()
    if value < 0:
        raise ValueError(f"{what} must be >= 0, not {value}")
    return value


def _io_view(what, buf, writable, args, kwargs):
    """(buffer, file offset) for pread/pwrite: buf itself, or for a `size` short of it a uint8 view of its first
    `size` bytes (the batch moves a buffer's whole nbytes)."""
    _, nbytes, _, offset = _io_args(what, buf, writable, args, kwargs)
    if nbytes == _nbytes_of(buf):
        return buf, offset
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(buf, torch.Tensor):
        return buf.reshape(-1).view(torch.uint8)[:nbytes], offset
    return buf.reshape(-1).view("uint8")[:nbytes], offset


def _nbytes_of(buf) -> int:
    return buffer_of(buf, writable=False, what="File")[1]
