"""gdskit: move data between storage and GPU memory, and say which path it took.

    import gdskit
    tensors = gdskit.load_safetensors("model.safetensors", device="cuda:0")   # {name: torch.Tensor}
    gdskit.read("data.bin", tensor, offset=0)                                  # fill an existing tensor
    path, reasons = gdskit.plan("model.safetensors", device="cuda:0")          # ("staged", ["nvidia-fs ..."])

Tensors leave the library through DLPack, so torch is only needed at run time (and only for torch tensors).
Errors are OSError with the errno of the failure (FileNotFoundError, ...); a malformed file is EBADMSG.
"""

from __future__ import annotations

import errno as _errno

from . import _gdskit

__version__ = _gdskit.__version__
Tensor = _gdskit.Tensor

__all__ = ["load_safetensors", "load_safetensors_raw", "read", "plan", "header", "gpu_available", "last_stats",
           "Tensor", "__version__"]

_last_stats: dict = {}

# safetensors dtypes that leave as raw bytes, and the torch dtype they are reinterpreted as when torch has it.
_TORCH_VIEW = {
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


# safetensors dtype -> torch dtype name, for views of a torch-owned allocation.
_TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool", "C64": "complex64",
}


def _torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch


def _to_torch(torch, t: Tensor):
    x = torch.from_dlpack(t)
    if t.raw_bytes:
        name = _TORCH_VIEW.get(t.dtype)
        if name is not None and hasattr(torch, name):
            x = x.view(getattr(torch, name))
        # F4 / F6 stay packed uint8 bytes: torch has no unpacked dtype for them.
    return x


def _torch_view(torch, storage, base: int, t: Tensor):
    """t as a torch tensor viewing `storage` (a uint8 CUDA tensor the load wrote into)."""
    x = storage.narrow(0, t.data_ptr - base, t.nbytes)
    if t.raw_bytes:
        name = _TORCH_VIEW.get(t.dtype)
        if name is None:
            return x  # packed 4-/6-bit floats stay bytes, as through DLPack
        x = x.view(list(t.shape))
        return x.view(getattr(torch, name)) if hasattr(torch, name) else x
    dt = getattr(torch, _TORCH_DTYPES.get(t.dtype, ""), None)
    if dt is None:
        # A dtype this torch build lacks: DLPack's view, copied, since the view would not keep `storage` alive.
        return _to_torch(torch, t).clone()
    try:
        x = x.view(dt)
    except RuntimeError:
        # The tensor's offset in the file is not a multiple of its element size (legal in safetensors, rare):
        # torch cannot view it in place, so it gets its own aligned copy.
        x = x.clone().view(dt)
    return x.view(list(t.shape))


def load_safetensors_raw(path, device: str = "cpu", *, only=None, rank=None, world=None, split_dim: int = 0,
                         allocate=None):
    """Loads like load_safetensors but returns gdskit.Tensor objects (DLPack exporters) and the stats dict.
    Works without torch or numpy: each Tensor has .dtype, .shape, .nbytes, .tobytes() (host) and __dlpack__.
    allocate(nbytes) -> address, if given, supplies the one allocation; the caller keeps it alive."""
    tensors, stats = _gdskit.load(str(path), device, list(only or []), rank, world, split_dim, allocate)
    return tensors, stats


def load_safetensors(path, device: str = "cuda:0", *, only=None, rank=None, world=None, split_dim: int = 0,
                     framework: str = "auto", group=None, **distributed):
    """Loads a .safetensors file, a *.safetensors.index.json or a folder into one allocation on `device`
    ("cpu", "cuda", "cuda:N") and returns {name: tensor}.

    only: names, or prefixes ending in '.' or '*'. rank/world/split_dim: this rank's slice (numpy.array_split
    rule) of every tensor with more than split_dim dimensions. framework: "torch", "numpy", "dlpack" (gdskit.Tensor
    objects) or "auto" (torch if importable, else numpy for cpu, else dlpack). The allocation is freed when the
    last tensor that views it is gone. Statistics of the load: gdskit.last_stats().
    """
    global _last_stats
    # Distributed load over a torch.distributed group (tp_rank, tp_world, placement, node, timeout): distributed.py
    if group is not None or distributed:
        from . import distributed as _distributed  # noqa: PLC0415
        out = _distributed.load_safetensors(path, device, group=group, only=only, **distributed)
        _last_stats = _distributed.last_stats()
        return out
    if framework == "auto":
        if _torch() is not None:
            framework = "torch"
        elif device == "cpu" and _numpy() is not None:
            framework = "numpy"
        else:
            framework = "dlpack"
    if framework == "torch" and device != "cpu":
        # GPU memory from torch's caching allocator: no cuMemAlloc per load when torch has the memory cached,
        # and the tensors are ordinary views of one torch tensor.
        torch = _torch()
        if torch is None:
            raise ImportError("framework='torch' needs torch")
        storage = []

        def allocate(nbytes):
            storage.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
            return storage[-1].data_ptr()

        tensors, stats = load_safetensors_raw(path, device, only=only, rank=rank, world=world, split_dim=split_dim,
                                              allocate=allocate)
        _last_stats = stats
        base = storage[0].data_ptr()
        return {k: _torch_view(torch, storage[0], base, v) for k, v in tensors.items()}
    tensors, stats = load_safetensors_raw(path, device, only=only, rank=rank, world=world, split_dim=split_dim)
    _last_stats = stats
    if framework == "torch":
        torch = _torch()
        if torch is None:
            raise ImportError("framework='torch' needs torch")
        return {k: _to_torch(torch, v) for k, v in tensors.items()}
    if framework == "numpy":
        np = _numpy()
        if np is None:
            raise ImportError("framework='numpy' needs numpy")
        return {k: _to_numpy(np, v) for k, v in tensors.items()}
    if framework == "dlpack":
        return tensors
    raise ValueError(f"framework must be auto, torch, numpy or dlpack, not {framework!r}")


def _numpy():
    try:
        import numpy  # noqa: PLC0415
    except ImportError:
        return None
    return numpy


def _to_numpy(np, t: Tensor):
    # numpy has no bfloat16 or 8-bit floats: those stay raw bytes (uint8) with the tensor's shape in bytes.
    if t.dtype in ("BF16",) or t.raw_bytes:
        return np.frombuffer(t.tobytes(), dtype=np.uint8)
    return np.from_dlpack(t)


def last_stats() -> dict:
    """Statistics of the last load_safetensors call: seconds (the reads), header_seconds, alloc_seconds,
    gib_per_s, tensor_bytes, bytes_read, read_requests, files, path, reasons, metadata."""
    return dict(_last_stats)


def read(path, tensor, offset: int = 0) -> int:
    """Reads tensor.nbytes bytes at `offset` of the file into `tensor` (a contiguous torch tensor on the CPU or
    a CUDA device, or any object with __array_interface__). Returns the bytes read (fewer only at end of file)."""
    torch = _torch()
    if torch is not None and isinstance(tensor, torch.Tensor):
        if not tensor.is_contiguous():
            raise OSError(_errno.EINVAL, "gdskit.read: tensor must be contiguous")
        nbytes = tensor.numel() * tensor.element_size()
        device = tensor.device.index if tensor.is_cuda else -1
        if tensor.is_cuda and device is None:
            device = torch.cuda.current_device()
        return _gdskit.read_into(str(path), tensor.data_ptr(), nbytes, offset, device)
    iface = getattr(tensor, "__array_interface__", None)
    if iface is not None:
        ptr, readonly = iface["data"]
        if readonly:
            raise OSError(_errno.EINVAL, "gdskit.read: array is read-only")
        if iface.get("strides") is not None:
            raise OSError(_errno.EINVAL, "gdskit.read: array must be contiguous")
        return _gdskit.read_into(str(path), ptr, tensor.nbytes, offset, -1)
    raise TypeError("gdskit.read: pass a torch.Tensor or a numpy array")


def plan(path, device: str = "cuda:0"):
    """The data path gdskit takes to read `path` into memory on `device`, and the reasons:
    ("gds" | "staged" | "compat" | "host", [reason, ...])."""
    return _gdskit.plan(str(path), device)


def header(path):
    """The validated safetensors header: ([{name, dtype, shape, data_offsets, file_offset}], metadata)."""
    return _gdskit.header(str(path))


def gpu_available():
    """(True, "") when a CUDA GPU can be used, else (False, reason)."""
    return _gdskit.gpu_available()
