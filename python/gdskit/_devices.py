"""Device arguments as the package takes them everywhere: "cpu", "cuda", "cuda:N", N (int) or torch.device.
Each public function parses its device once, here, and hands the index on."""

from __future__ import annotations

import operator

from . import _gdskit


def parse_device(device) -> int:
    """-1 for the CPU, N for CUDA device N. ValueError for a malformed or unknown device, TypeError for a value
    that is no device at all, OSError(ENODEV) with the reason for a CUDA device this machine cannot use (before
    any framework is asked for memory there)."""
    index = _parse(device)
    _gdskit.check_device(index)
    return index


def _parse(device) -> int:
    if isinstance(device, bool):
        raise TypeError(f"device must be a str, an int or a torch.device, not {type(device).__name__}")
    if isinstance(device, int) or (hasattr(device, "__index__") and not isinstance(device, (str, bytes))):
        ordinal = operator.index(device)  # ints, and integer scalars such as numpy.int64
        if ordinal < 0:
            raise ValueError(f"device ordinal must be >= 0, not {ordinal}")
        return ordinal
    if type(device).__name__ == "device" and hasattr(device, "type") and hasattr(device, "index"):
        kind, index = device.type, device.index
        if kind == "cpu":
            return -1
        if kind == "cuda":
            return _current_cuda_device() if index is None else int(index)
        raise ValueError(f"device type {kind!r} is not supported (cpu or cuda)")
    if isinstance(device, str):
        text = device
        if text == "cpu":
            return -1
        if text == "cuda":
            return _current_cuda_device()
        if text.startswith("cuda:"):
            number = text[5:]
            if number.isdigit() and number.isascii():
                return int(number)
        raise ValueError(f"device must be \"cpu\", \"cuda\" or \"cuda:N\", not {device!r}")
    raise TypeError(f"device must be a str, an int or a torch.device, not {type(device).__name__}")


def device_name(index: int) -> str:
    """"cpu" or "cuda:N", the form torch takes."""
    return "cpu" if index < 0 else f"cuda:{index}"


def _current_cuda_device() -> int:
    # "cuda" means torch's current device when torch has initialised CUDA; else device 0.
    import sys  # noqa: PLC0415

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001
        pass
    return 0
