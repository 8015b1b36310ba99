"""What the engine adapters share: opening the block store from an engine's configuration, turning engine keys
into store keys, host memory as arrays the store takes, and reading a batch future's per-key outcome."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import numbers
import os

KEY_BYTES = 32  # the store's largest key: engine keys of any length are hashed to this size

# The store adapters open. A module-level seam so that tests can substitute a stand-in; engines never set it.
store_class = None


def open_store(paths, *, capacity_bytes: int, block_bytes: int, namespace: str, durability: str = "cache",
               deadline_s: float = 2.0):
    """A gdskit.kv.BlockStore with these arguments (store_class when a test set one). ImportError naming the
    cause when gdskit.kv is missing from this build."""
    cls = store_class
    if cls is None:
        try:
            cls = importlib.import_module("gdskit.kv").BlockStore
        except (ImportError, AttributeError) as e:
            raise ImportError(f"gdskit.kv.BlockStore is not available in this gdskit build ({e})") from e
    return cls(paths, capacity_bytes=capacity_bytes, block_bytes=block_bytes, namespace=namespace,
               durability=durability, deadline_s=deadline_s)


def store_key(*parts) -> bytes:
    """A 32-byte store key for an engine key made of `parts` (str, bytes or int). Distinct part tuples give
    distinct keys (each part is length-prefixed before hashing)."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"gdskit-kv-engine")
    for p in parts:
        if isinstance(p, str):
            raw, tag = p.encode("utf-8", "surrogatepass"), b"s"
        elif isinstance(p, (bytes, bytearray, memoryview)):
            raw, tag = bytes(p), b"b"
        elif isinstance(p, numbers.Integral) and not isinstance(p, bool):
            raw, tag = str(int(p)).encode(), b"i"
        else:
            raise TypeError(f"a key part must be str, bytes or int, not {type(p).__name__}")
        h.update(tag + len(raw).to_bytes(8, "little") + raw)
    return h.digest()


def _np():
    try:
        import numpy  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"the engine adapters need numpy for host buffers ({e})") from e
    return numpy


@functools.lru_cache(maxsize=256)
def _ubyte_array_type(nbytes: int):
    # ctypes makes a new type for every (c_ubyte * n) and never frees it: one type per size.
    return ctypes.c_ubyte * nbytes


def host_array(address: int, nbytes: int):
    """A writable numpy uint8 array over nbytes of host memory at `address` (memory the engine owns and keeps
    alive while the store uses it). ValueError for a null address or a negative size."""
    if not address or nbytes < 0:
        raise ValueError(f"bad host buffer: address {address:#x}, {nbytes} bytes")
    return _np().frombuffer(_ubyte_array_type(nbytes).from_address(address), dtype=_np().uint8)


def buffer_array(buf, *, writable: bool):
    """A numpy uint8 array over the bytes of a buffer-protocol object (memoryview, bytearray, numpy array)
    without copying. ValueError for a non-contiguous buffer, or a read-only one when writable."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("the buffer must be contiguous")
    if writable and mv.readonly:
        raise ValueError("the buffer is read-only")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return _np().frombuffer(mv, dtype=_np().uint8)


def outcome_mask(result, n: int, what: str) -> list:
    """The per-key outcome (list of n bools) of a store call or of a batch future's result()."""
    try:
        mask = [bool(x) for x in result]
    except TypeError:
        raise TypeError(f"{what}: the store returned {type(result).__name__}, not a per-key list") from None
    if len(mask) != n:
        raise ValueError(f"{what}: the store returned {len(mask)} outcomes for {n} keys")
    return mask


def rank_folder(paths, name: str) -> list:
    """Each store folder of `paths` (a folder or a list of them) with the subfolder `name`, created: one writer
    process per store folder, so every engine rank gets its own. ValueError for an empty list or a name that
    is not a plain folder name."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("no store folder given")
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"bad store subfolder name {name!r}")
    out = []
    for p in paths:
        sub = os.path.join(p, name)
        os.makedirs(sub, exist_ok=True)
        out.append(sub)
    return out


def config_value(config: dict, name: str, kind, default=None, *, required: bool = False, where: str):
    """config[name] checked to be of `kind` (int accepts integral floats, float accepts ints); the default when
    absent. ValueError naming `where` and the field for a wrong type or a missing required field."""
    if name not in config or config[name] is None:
        if required:
            raise ValueError(f"{where}: '{name}' is required")
        return default
    v = config[name]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
            raise ValueError(f"{where}: '{name}' must be an integer, not {v!r}")
        return int(v)
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{where}: '{name}' must be a number, not {v!r}")
        return float(v)
    if kind is bool:
        if not isinstance(v, (bool, int)):
            raise ValueError(f"{where}: '{name}' must be true or false, not {v!r}")
        return bool(v)
    if kind is str:
        if not isinstance(v, str):
            raise ValueError(f"{where}: '{name}' must be a string, not {v!r}")
        return v
    if kind is list:  # folders: one or a list of them
        if isinstance(v, str):
            return [v]
        if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, str) and x for x in v):
            raise ValueError(f"{where}: '{name}' must be a folder or a non-empty list of folders, not {v!r}")
        return list(v)
    raise TypeError(kind)


def capacity_from(config: dict, where: str) -> int:
    """The store capacity in bytes from 'capacity_bytes' or 'capacity_gb' (GiB): exactly one is required."""
    b = config_value(config, "capacity_bytes", int, where=where)
    g = config_value(config, "capacity_gb", float, where=where)
    if (b is None) == (g is None):
        raise ValueError(f"{where}: give exactly one of 'capacity_bytes' or 'capacity_gb'")
    cap = b if b is not None else int(g * (1 << 30))
    if cap <= 0:
        raise ValueError(f"{where}: the capacity must be positive")
    return cap
