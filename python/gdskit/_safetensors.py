"""The safetensors library's reading API (load_file, safe_open) on gdskit's engine."""

from __future__ import annotations

import errno as _errno
import os
import stat as _stat

from . import _frameworks
from . import _gdskit
from ._buffers import buffer_of
from ._devices import device_name, parse_device

SafetensorError = _gdskit.SafetensorError

_F6 = ("F6_E2M3", "F6_E3M2")
# Memory a slice may hold beyond its result while it reads (the compiled module's bound; tests lower it).
_SLICE_MEMORY_BYTES = _gdskit.SLICE_MEMORY_BYTES


def _check_framework(framework) -> str:
    if not isinstance(framework, str):
        raise TypeError(f"framework must be a str, not {type(framework).__name__}")
    if framework in ("pt", "torch", "pytorch"):
        return "pt"
    if framework in ("np", "numpy"):
        return "np"
    raise ValueError(f"framework {framework!r} is not supported: \"pt\" (torch) or \"np\" (numpy)")


def _fspath(filename):
    try:
        return os.fspath(filename)
    except TypeError:
        raise TypeError(f"filename must be a str or os.PathLike, not {type(filename).__name__}") from None


def _refuse_folder(path: str):
    # The engine loads folders and indexes; these functions read one file, as the safetensors library does.
    try:
        st = os.stat(path)
    except OSError:
        return  # the open reports it with the errno
    if _stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), path)


def _byte_buffer(framework: str, nbytes: int, device: int):
    if framework == "np":
        return _frameworks.numpy().empty(nbytes, dtype="uint8")
    torch = _frameworks.torch()
    return torch.empty(nbytes, dtype=torch.uint8, device=device_name(device))


def load_file(filename, device="cpu"):
    """Loads a .safetensors file into a dict {name: torch.Tensor}, like safetensors.torch.load_file: the same
    dtypes and shapes, keys in the file's data order. device: "cpu", "cuda", "cuda:N", N or a torch.device.
    The tensors are views of one allocation (freed when the last of them is gone). Raises FileNotFoundError,
    IsADirectoryError, PermissionError, ... (OSError with errno and filename) and SafetensorError for a
    malformed file."""
    from . import _load  # noqa: PLC0415

    path = _fspath(filename)
    index = parse_device(device)
    _refuse_folder(path)
    return _load(path, index, framework="torch")


class _Entry:
    __slots__ = ("name", "dtype", "shape", "file_offset", "nbytes", "begin", "element_shape")

    def __init__(self, d):
        self.name = d["name"]
        self.dtype = d["dtype"]
        self.shape = list(d["shape"])
        self.file_offset = d["file_offset"]
        self.begin = d["data_offsets"][0]
        self.nbytes = d["data_offsets"][1] - d["data_offsets"][0]
        self.element_shape = _gdskit.element_shape(self.dtype, self.shape)


class safe_open:  # noqa: N801 (the safetensors library's name)
    """Opens a safetensors file and reads tensors on demand, like safetensors.safe_open:

        with gdskit.safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
            for name in f.keys():
                t = f.get_tensor(name)
            part = f.get_slice("embed.weight")[:, :1024]   # reads only the bytes the slice needs

    framework: "pt" (torch tensors) or "np" (numpy arrays; CPU only). Raises ValueError for a bad framework or
    device (or a path with a NUL byte), OSError(ENODEV) for a CUDA device without a usable GPU, OSError
    subclasses for I/O errors and SafetensorError for a malformed file."""

    def __init__(self, filename, framework="pt", device="cpu"):
        self._framework = _check_framework(framework)
        self._device = parse_device(device)
        if self._framework == "np" and self._device >= 0:
            raise ValueError("framework \"np\" gives numpy arrays, which live on the CPU: use device=\"cpu\"")
        path = _fspath(filename)
        _refuse_folder(path)
        self._handle = _gdskit.FileHandle(path, "r")
        entries, metadata = self._handle.header()
        self._entries = {d["name"]: _Entry(d) for d in entries}
        self._metadata = dict(metadata) if metadata else None
        self.filename = path
        # (bytes, requests, most memory held beyond the result) of the last slice read, for tests
        self._slice_reads = (0, 0, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _open(self):
        if self._handle is None:
            raise SafetensorError(_errno.EBADF, "File is closed")
        return self._handle

    def _entry(self, name):
        self._open()
        entry = self._entries.get(name)
        if entry is None:
            raise SafetensorError(_errno.EBADMSG, f"File does not contain tensor {name}")
        return entry

    def keys(self):
        """Tensor names, sorted (as the safetensors library lists them)."""
        self._open()
        return sorted(self._entries)

    def offset_keys(self):
        """Tensor names in the order of their data in the file."""
        self._open()
        return [e.name for e in sorted(self._entries.values(), key=lambda e: (e.begin, e.name))]

    def metadata(self):
        """The "__metadata__" strings, or None when the file has none."""
        self._open()
        return dict(self._metadata) if self._metadata is not None else None

    def get_tensor(self, name):
        entry = self._entry(name)
        if entry.nbytes == 0:
            return _frameworks.empty(self._framework, entry.dtype, entry.element_shape, device_name(self._device))
        raw = _byte_buffer(self._framework, entry.nbytes, self._device)
        self._read(raw, entry.nbytes, entry.file_offset, self._device)
        return _frameworks.typed(self._framework, raw, entry.dtype, entry.element_shape)

    def get_slice(self, name):
        return _Slice(self, self._entry(name))

    def _read(self, raw, nbytes, offset, device):
        ptr, _, _ = buffer_of(raw, writable=True, what="safe_open")
        got = self._open().read(ptr, nbytes, offset, device)
        if got != nbytes:
            raise OSError(_errno.EIO, f"{self.filename}: file ended after {got} of {nbytes} bytes at {offset}",
                          self.filename)


class _Slice:
    """A tensor of an open file, sliced on demand: only the byte ranges the slice needs are read."""

    def __init__(self, owner: safe_open, entry: _Entry):
        self._owner = owner
        self._entry = entry

    def get_shape(self):
        return list(self._entry.shape)

    def get_dtype(self):
        return self._entry.dtype

    def __getitem__(self, index):
        entry, owner = self._entry, self._owner
        if entry.dtype in _F6:
            raise SafetensorError(_errno.EBADMSG, f"{entry.dtype} tensors cannot be sliced: 6-bit values share bytes")
        shape = entry.element_shape
        elem = _frameworks.DTYPES[entry.dtype][1]
        # numpy's indexing rules, applied by the compiled module: picks per dimension, the result's shape, bytes.
        picks, newshape, total = _gdskit.slice_picks(index, shape, elem)
        framework, device = owner._framework, owner._device
        if total == 0:
            return _frameworks.empty(framework, entry.dtype, newshape, device_name(device))
        # The compiled module plans the byte ranges and reads them straight into this memory (GPU memory too).
        raw = _byte_buffer(framework, total, device)
        ptr, _, where = buffer_of(raw, writable=True, what="safe_open")
        owner._slice_reads = _gdskit.read_slice(owner._open(), entry.file_offset, shape, elem, picks, ptr, total,
                                                where, _SLICE_MEMORY_BYTES)
        return _frameworks.typed(framework, raw, entry.dtype, newshape)
