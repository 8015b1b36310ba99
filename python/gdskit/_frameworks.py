"""torch and numpy as the package meets them: imported in one place, and given tensors made once.

A tensor in gdskit's memory (a gdskit.Tensor from a load) becomes a torch tensor or numpy array through DLPack: its
bytes are imported as they are (uint8, which every framework version accepts) and viewed with the dtype and shape
the compiled module's table gives; nothing is copied unless the bytes are not aligned for their type. Bytes a
framework allocated itself (a read into torch.empty) are viewed the same way."""

from __future__ import annotations

import importlib

from . import _gdskit

# {safetensors dtype: (bits, bytes per framework element, torch name or None, numpy name, numpy name is the type)}
DTYPES = _gdskit.dtype_table()


def torch(required: str = ""):
    """The torch module, or None when it cannot be imported; with `required` (what needs it), ImportError."""
    return _module("torch", required)


def numpy(required: str = ""):
    """The numpy module, or None when it cannot be imported; with `required` (what needs it), ImportError."""
    return _module("numpy", required)


def _module(name: str, required: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        if required:
            raise ImportError(f"{required} needs {name}") from None
        return None


def torch_dtype(module, dtype: str):
    """torch's dtype for a safetensors dtype: uint8 (the raw bytes) for float formats this torch lacks;
    TypeError for the unsigned integers before torch 2.3, as in safetensors."""
    name = DTYPES[dtype][2]
    found = getattr(module, name, None) if name else None
    if found is None:
        if dtype in ("U16", "U32", "U64"):
            raise TypeError(f"dtype {dtype} needs a torch with torch.{name} (2.3 or later); this is "
                            f"{module.__version__}")
        found = module.uint8
    return found


def numpy_dtype(module, dtype: str):
    """numpy's dtype for a safetensors dtype (the raw bits' unsigned type where numpy has no such float)."""
    return module.dtype(DTYPES[dtype][3])


def typed(framework: str, raw, dtype: str, element_shape):
    """`raw`, a contiguous uint8 torch tensor or numpy array holding a tensor's bytes, viewed as that tensor
    (element_shape: the compiled module's element shape for the dtype and file shape)."""
    if framework == "np":
        return raw.view(numpy_dtype(numpy(), dtype)).reshape(element_shape)
    return raw.view(torch_dtype(torch(), dtype)).reshape(element_shape)


def empty(framework: str, dtype: str, element_shape, device: str = "cpu"):
    """A tensor with no bytes (a zero dimension): nothing to import."""
    if framework == "np":
        np = numpy()
        return np.zeros(element_shape, dtype=numpy_dtype(np, dtype))
    module = torch()
    return module.zeros(element_shape, dtype=torch_dtype(module, dtype), device=device)


def from_tensor(framework: str, t):
    """A gdskit.Tensor as a torch tensor ("pt") or numpy array ("np", host memory only), sharing its memory."""
    if t.nbytes == 0:
        return empty(framework, t.dtype, t.element_shape, "cpu" if t.device < 0 else f"cuda:{t.device}")
    if framework == "np":
        raw = numpy().from_dlpack(t.raw())
        if not t.aligned:
            raw = raw.copy()
    else:
        raw = torch().utils.dlpack.from_dlpack(t.raw())
        if not t.aligned:
            raw = raw.clone()  # a typed view of misaligned bytes would fault in GPU kernels
    return typed(framework, raw, t.dtype, t.element_shape)
