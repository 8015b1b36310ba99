"""Memory of torch tensors and numpy arrays as the compiled module takes it: (address, nbytes, device)."""

from __future__ import annotations

import sys


def buffer_of(obj, *, writable: bool, what: str):
    """(address, nbytes, device) of a contiguous torch tensor (any device) or numpy array; device -1 is host
    memory. TypeError for anything else, ValueError for a non-contiguous or read-only buffer."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if not obj.is_contiguous():
            raise ValueError(f"{what}: the tensor must be contiguous")
        if obj.is_cuda:
            device = obj.device.index if obj.device.index is not None else torch.cuda.current_device()
        elif obj.device.type == "cpu":
            device = -1
        else:
            raise ValueError(f"{what}: tensors on {obj.device.type} are not supported (cpu or cuda)")
        return obj.data_ptr(), obj.numel() * obj.element_size(), device
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None and hasattr(obj, "nbytes"):
        ptr, readonly = iface["data"]
        if writable and readonly:
            raise ValueError(f"{what}: the array is read-only")
        flags = getattr(obj, "flags", None)
        contiguous = flags["C_CONTIGUOUS"] if flags is not None else iface.get("strides") is None
        if not contiguous:
            raise ValueError(f"{what}: the array must be C-contiguous")
        return ptr, int(obj.nbytes), -1
    raise TypeError(f"{what}: pass a torch.Tensor or a numpy array, not {type(obj).__name__}")
