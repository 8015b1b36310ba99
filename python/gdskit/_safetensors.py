"""The safetensors library's reading API (load_file, safe_open) on gdskit's engine."""

from __future__ import annotations

import os
import stat as _stat
import errno as _errno

from . import _gdskit
from ._devices import device_name, parse_device

SafetensorError = _gdskit.SafetensorError

# safetensors dtype -> (torch dtype name, numpy dtype name). The numpy name is the raw bits' integer type where
# numpy has no such float (bfloat16, 8-bit floats). Packed 4-bit floats leave as bytes, two values per byte
# (torch's float4_e2m1fn_x2 where it exists); 6-bit floats as flat bytes.
_DTYPES = {
    "F64": ("float64", "float64"), "F32": ("float32", "float32"), "F16": ("float16", "float16"),
    "BF16": ("bfloat16", "uint16"), "C64": ("complex64", "complex64"),
    "I64": ("int64", "int64"), "I32": ("int32", "int32"), "I16": ("int16", "int16"), "I8": ("int8", "int8"),
    "U64": ("uint64", "uint64"), "U32": ("uint32", "uint32"), "U16": ("uint16", "uint16"), "U8": ("uint8", "uint8"),
    "BOOL": ("bool", "bool"),
    "F8_E4M3": ("float8_e4m3fn", "uint8"), "F8_E5M2": ("float8_e5m2", "uint8"), "F8_E8M0": ("float8_e8m0fnu", "uint8"),
    "F4": ("float4_e2m1fn_x2", "uint8"), "F6_E2M3": (None, "uint8"), "F6_E3M2": (None, "uint8"),
}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "C64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
             "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
# Gaps up to this many bytes between the ranges a slice needs are read rather than skipped: the kernel reads
# whole pages anyway, and one request costs more than a page.
_SLICE_GAP_BYTES = 4096
# Host memory a slice reads through at once, gaps included (as the C++ loader's staging budget): a column of a
# large tensor must not read the whole tensor into memory to keep a few bytes of each row.
_GATHER_WINDOW_BYTES = 64 << 20
# Byte indexes built at once to pick the segments out of a window (8 bytes each).
_PICK_INDEXES = 1 << 20
# Segment offsets a slice computes at once (8 bytes each, and a few arrays of that size while they are read).
_SEGMENTS_AT_ONCE = 1 << 18
_F6 = ("F6_E2M3", "F6_E3M2")


def _torch():
    import torch  # noqa: PLC0415

    return torch


def _numpy():
    import numpy  # noqa: PLC0415

    return numpy


def _element_shape(dtype: str, shape):
    """The shape the framework sees, in elements of _element_bytes(dtype) bytes: the file's shape, except for
    packed dtypes (F4: two values per byte along the last dimension; F6: flat bytes)."""
    shape = list(shape)
    if dtype == "F4":
        if shape and shape[-1] % 2 == 0:
            return shape[:-1] + [shape[-1] // 2]
        return [_packed_nbytes(dtype, shape)]
    if dtype in _F6:
        return [_packed_nbytes(dtype, shape)]
    return shape


def _packed_nbytes(dtype: str, shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * (4 if dtype == "F4" else 6) // 8


def _element_bytes(dtype: str) -> int:
    return _ITEMSIZE.get(dtype, 1)


def _torch_dtype(torch, dtype: str):
    name = _DTYPES[dtype][0]
    found = getattr(torch, name, None) if name else None
    if found is None:
        if dtype in ("U16", "U32", "U64"):
            raise TypeError(f"dtype {dtype} needs a torch with torch.{name} (2.3 or later); this is {torch.__version__}")
        found = torch.uint8  # 8-bit and packed floats this torch lacks: the raw bytes
    return found


def _as_framework(framework: str, raw, dtype: str, shape, device: int):
    """raw: a contiguous uint8 torch tensor or numpy array holding the tensor's bytes."""
    eshape = _element_shape(dtype, shape)
    if framework == "np":
        np = _numpy()
        return raw.view(np.dtype(_DTYPES[dtype][1])).reshape(eshape)
    torch = _torch()
    out = raw.view(_torch_dtype(torch, dtype)).reshape(eshape)
    if device >= 0 and out.device.type != "cuda":
        out = out.to(device_name(device))
    return out


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


def _empty(framework: str, dtype: str, shape, device: int):
    eshape = _element_shape(dtype, shape)
    if framework == "np":
        np = _numpy()
        return np.zeros(eshape, dtype=np.dtype(_DTYPES[dtype][1]))
    torch = _torch()
    return torch.zeros(eshape, dtype=_torch_dtype(torch, dtype), device=device_name(device))


def _byte_buffer(framework: str, nbytes: int, device: int):
    if framework == "np":
        return _numpy().empty(nbytes, dtype="uint8")
    torch = _torch()
    return torch.empty(nbytes, dtype=torch.uint8, device=device_name(device))


def load_file(filename, device="cpu"):
    """Loads a .safetensors file into a dict {name: torch.Tensor}, like safetensors.torch.load_file: the same
    dtypes and shapes, keys in the file's data order. device: "cpu", "cuda", "cuda:N", N or a torch.device.
    The tensors are views of one allocation (freed when the last of them is gone). Raises FileNotFoundError,
    IsADirectoryError, PermissionError, ... (OSError with errno and filename) and SafetensorError for a
    malformed file."""
    from . import load_safetensors  # noqa: PLC0415

    path = _fspath(filename)
    index = parse_device(device)
    _refuse_folder(path)
    return load_safetensors(path, device=device_name(index), framework="torch")


class _Entry:
    __slots__ = ("name", "dtype", "shape", "file_offset", "nbytes", "begin")

    def __init__(self, d):
        self.name = d["name"]
        self.dtype = d["dtype"]
        self.shape = list(d["shape"])
        self.file_offset = d["file_offset"]
        self.begin = d["data_offsets"][0]
        self.nbytes = d["data_offsets"][1] - d["data_offsets"][0]


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
        if self._device >= 0:
            # Documented as for gdskit.plan: without a usable GPU, OSError(ENODEV) with the reason (the tensors
            # would otherwise fail later, in the framework's own allocator, with its own error).
            usable, why = _gdskit.gpu_available()
            if not usable:
                raise OSError(_errno.ENODEV, f"cuda:{self._device}: no usable GPU: {why}", path)
        _refuse_folder(path)
        self._handle = _gdskit.FileHandle(path, "r")
        entries, metadata = self._handle.header()
        self._entries = {d["name"]: _Entry(d) for d in entries}
        self._metadata = dict(metadata) if metadata else None
        self.filename = path

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
            return _empty(self._framework, entry.dtype, entry.shape, self._device)
        raw = _byte_buffer(self._framework, entry.nbytes, self._device)
        self._read(raw, entry.nbytes, entry.file_offset, self._device)
        return _as_framework(self._framework, raw, entry.dtype, entry.shape, self._device)

    def get_slice(self, name):
        return _Slice(self, self._entry(name))

    def _read(self, raw, nbytes, offset, device, at=0):
        from ._buffers import buffer_of  # noqa: PLC0415

        ptr, _, _ = buffer_of(raw, writable=True, what="safe_open")
        got = self._open().read(ptr + at, nbytes, offset, device)
        if got != nbytes:
            raise OSError(_errno.EIO, f"{self.filename}: file ended after {got} of {nbytes} bytes at {offset}",
                          self.filename)


def _normalize_index(index, shape):
    """[(start, count, step, keep)] per dimension for ints, slices and one Ellipsis."""
    if isinstance(index, list):
        raise TypeError("lists are not supported as slice indices: use ints, slices and ...")
    items = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        fill = len(shape) - (len(items) - 1)
        items = items[:at] + (slice(None),) * max(fill, 0) + items[at + 1:]
    if len(items) > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    items = items + (slice(None),) * (len(shape) - len(items))
    out = []
    for dim, (item, n) in enumerate(zip(items, shape)):
        if isinstance(item, bool) or not isinstance(item, (int, slice)) and not hasattr(item, "__index__"):
            raise TypeError(f"index {item!r} of dimension {dim}: only ints, slices and ... are supported")
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step <= 0:
                raise ValueError(f"slice step must be positive, not {step}")
            out.append((start, len(range(start, stop, step)), step, True))
        else:
            i = item.__index__()
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {n}")
            out.append((i % n, 1, 1, False))
    return out


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
        np = _numpy()
        entry, owner = self._entry, self._owner
        if entry.dtype in _F6:
            raise SafetensorError(_errno.EBADMSG, f"{entry.dtype} tensors cannot be sliced: 6-bit values share bytes")
        shape = _element_shape(entry.dtype, entry.shape)
        elem = _element_bytes(entry.dtype)
        sel = _normalize_index(index, shape)
        newshape = [count for (_, count, _, keep) in sel if keep]
        # Byte offsets of the segments, in file order: the dimensions after the last partly selected one are
        # whole, so each segment is contiguous.
        strides = [elem] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        total = elem
        for (_, count, _, _) in sel:
            total *= count
        framework, device = owner._framework, owner._device
        if total == 0:
            return _empty(framework, entry.dtype, _file_shape(entry.dtype, newshape), device)
        k = len(sel) - 1
        while k >= 0 and sel[k][0] == 0 and sel[k][2] == 1 and sel[k][1] == shape[k]:
            k -= 1
        # Segments: every combination of the indices of the dimensions up to the last partly selected one
        # (`dims`, each (first, count, step, stride)), `seg` bytes each, `extra` bytes into the row.
        dims, extra = [], 0
        if k < 0:
            seg = total
        else:
            start, count, step, _ = sel[k]
            last = k if step != 1 else k - 1
            seg = strides[k] if step != 1 else count * strides[k]
            dims = [(sel[d][0], sel[d][1], sel[d][2], strides[d]) for d in range(last + 1)]
            if step == 1:
                extra = start * strides[k]
        segments = 1
        for _, c, _, _ in dims:
            segments *= c
        out = np.empty(total, dtype=np.uint8)
        # Their offsets are made a bounded number at a time (8 bytes each and a few temporaries: a slice of
        # 1-byte elements would otherwise need tens of times its own size), in file order.
        for a in range(0, segments, _SEGMENTS_AT_ONCE):
            b = min(segments, a + _SEGMENTS_AT_ONCE)
            flat = np.arange(a, b, dtype=np.int64)
            offsets = np.full(b - a, extra, dtype=np.int64)
            inner = 1
            for s0, c, st, stride in reversed(dims):
                offsets += (s0 + st * (flat // inner % c)) * stride
                inner *= c
            del flat
            _gather(owner, out[a * seg:b * seg], offsets, seg, entry.file_offset)
        if framework == "np":
            return out.view(np.dtype(_DTYPES[entry.dtype][1])).reshape(newshape)
        torch = _torch()
        return _as_framework("pt", torch.from_numpy(out), entry.dtype, _file_shape(entry.dtype, newshape), device)


def _file_shape(dtype, eshape):
    # Inverse of _element_shape for what slicing can produce (F4 with an even last dimension).
    if dtype == "F4" and eshape:
        return list(eshape[:-1]) + [eshape[-1] * 2]
    return list(eshape)


def _gather(owner, out, offsets, seg: int, base: int):
    """Reads segments of `seg` bytes at base + offsets (ascending) into `out`, one request per run of segments
    closer than _SLICE_GAP_BYTES, through windows of at most _GATHER_WINDOW_BYTES (at least one segment)."""
    np = _numpy()
    ends = offsets + seg
    breaks = np.nonzero(offsets[1:] - ends[:-1] > _SLICE_GAP_BYTES)[0] + 1
    pos = 0
    for group in np.split(np.arange(len(offsets)), breaks):
        lo, hi = int(offsets[group[0]]), int(ends[group[-1]])
        n = len(group) * seg
        if hi - lo == n:  # back to back: straight into place
            owner._read(out, n, base + lo, -1, at=pos)
            pos += n
            continue
        starts, stops = offsets[group], ends[group]
        i = 0
        while i < len(group):
            # The segments from i whose bytes end within one window of the first's start.
            j = max(i + 1, int(np.searchsorted(stops, starts[i] + _GATHER_WINDOW_BYTES, side="right")))
            wlo, whi = int(starts[i]), int(stops[j - 1])
            if j - i == 1:
                owner._read(out, seg, base + wlo, -1, at=pos)
            else:
                span = np.empty(whi - wlo, dtype=np.uint8)
                owner._read(span, whi - wlo, base + wlo, -1)
                rel = starts[i:j] - wlo
                per = max(1, _PICK_INDEXES // seg)
                for c in range(0, len(rel), per):
                    part = rel[c:c + per]
                    picks = (part[:, None] + np.arange(seg, dtype=np.int64)[None, :]).ravel()
                    at = pos + c * seg
                    out[at:at + len(part) * seg] = span[picks]
                del span
            pos += (j - i) * seg
            i = j
