"""Saving tensors as safetensors files and sharded checkpoints: gdskit.save_file, gdskit.save_sharded, and
gdskit.save / gdskit.load for the bytes of a file held in memory.

Files are byte-identical to what safetensors.torch.save_file writes for the same tensors and metadata, and
appear under their final name only once whole and on disk. save_file replaces an existing file atomically, as
safetensors does (a reader sees the old file or the new one, whole), unless overwrite=False.
"""

from __future__ import annotations

import errno as _errno
import os
import signal
import sys
import threading

from . import _frameworks
from . import _gdskit
from ._settings import _say_learned

__all__ = ["save_file", "save_sharded", "last_save_stats", "save", "load"]

_last_save_stats: dict = {}

# Default staging memory for strided (non-contiguous) tensors, made contiguous one piece at a time.
STAGING_BYTES = 64 << 20

# max_shard_size as huggingface_hub reads it (an int, or "5GB": decimal units), and binary units ("2GiB").
parse_shard_size = _gdskit.parse_shard_size


def last_save_stats() -> dict:
    """Statistics of the last save: seconds, sync_seconds, gib_per_s, tensor_bytes, file_bytes, files, pieces,
    path (the data path for the tensors' memory), reasons (asked once the first file's data was written, so
    they give the schedule its writes ended with), written (the final file names)."""
    return dict(_last_save_stats)


class _RowStager:
    """Hands out a strided tensor's C-order bytes a block of rows (along dimension 0) at a time, each block
    made contiguous on the tensor's own device within `budget` bytes (one row at least), so a strided tensor
    never needs a second full copy. `peers` are the stagers of the same save: strided tensors are written one
    after another, so making a block first drops every peer's last block (one block alive in the whole save)."""

    def __init__(self, t, nbytes, budget, contiguous, sync, peers):
        self.peers = peers
        self.t = t
        self.rows = t.shape[0]
        self.row_bytes = nbytes // self.rows
        self.per_block = max(1, budget // max(1, self.row_bytes))
        self.contiguous = contiguous
        self.sync = sync
        self.block = None

    def __call__(self, offset):
        first = offset // self.row_bytes
        last = min(self.rows, first + self.per_block)
        for s in self.peers:  # drop the previous block (this tensor's or the one before) before making the next
            s.block = None
        self.block = self.contiguous(self.t[first:last])
        ptr = self.sync(self.block)
        return ptr, (last - first) * self.row_bytes


def _lazy(t) -> bool:
    """Whether t is a conjugate or negative view: its memory holds the original values, and torch applies the
    conjugation or negation only when the values are read, so its bytes are not its values."""
    return bool((hasattr(t, "is_conj") and t.is_conj()) or (hasattr(t, "is_neg") and t.is_neg()))


def _resolved(t):
    """t with its values in its memory: a copy for a conjugate or negative view, t itself otherwise."""
    if hasattr(t, "is_conj") and t.is_conj():
        t = t.resolve_conj()
    if hasattr(t, "is_neg") and t.is_neg():
        t = t.resolve_neg()
    return t


def _utf8(text: str, what: str) -> str:
    """text, which the format stores as UTF-8; ValueError for a str that has no UTF-8 form (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} {text!r} is not valid UTF-8 text ({e.reason} at position {e.start})") from None
    return text


def _torch_entry(torch, name, t, budget, keep):
    dtype_name = str(t.dtype).split(".")[-1]
    if t.device.type == "cpu":
        device = -1
    elif t.device.type == "cuda":
        device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    else:
        raise ValueError(f"tensor `{name}` is on {t.device}; gdskit saves tensors on the CPU or CUDA devices")
    shape = list(t.shape)
    nbytes = t.numel() * t.element_size()
    lazy = _lazy(t)
    if lazy and t.dim() == 0:
        t = _resolved(t)  # one value: resolved whole (the stager works in rows)
        keep.append(t)
        lazy = False
    if (t.is_contiguous() and not lazy) or nbytes == 0:
        return (name, "torch", dtype_name, shape, t.data_ptr() if nbytes else 0, nbytes, device, None)

    def sync(block):
        if device >= 0:
            torch.cuda.current_stream(device).synchronize()
        return block.data_ptr()

    # Strided tensors, and conjugate or negative views (whose memory holds the original values), are written a
    # block of rows at a time, each block made contiguous with its values resolved.
    stager = _RowStager(t, nbytes, budget, lambda x: _resolved(x).contiguous(), sync, keep)
    keep.append(stager)
    return (name, "torch", dtype_name, shape, 0, nbytes, device, stager)


def _numpy_entry(np, name, a, budget, keep):
    if a.dtype.byteorder == ">":
        raise ValueError(f"array `{name}` is big-endian; safetensors files are little-endian")
    nbytes = a.nbytes
    if a.flags.c_contiguous or nbytes == 0:
        return (name, "numpy", a.dtype.name, list(a.shape), a.ctypes.data if nbytes else 0, nbytes, -1, None)
    stager = _RowStager(a, nbytes, budget, np.ascontiguousarray, lambda b: b.ctypes.data, keep)
    keep.append(stager)
    return (name, "numpy", a.dtype.name, list(a.shape), 0, nbytes, -1, stager)


def _check_shared(tensors):
    """RuntimeError for tensors whose memory overlaps, as safetensors refuses them (saving both would store the
    memory twice and load them as independent tensors). The rule is the compiled module's
    (check_shared_memory): torch tensors of one storage from first to last element, numpy arrays byte for byte;
    this only lists where each tensor lies. Conjugate and negative views are written as their resolved values,
    bytes of their own, so they share nothing on disk; tensors on the meta device have no memory."""
    # A tensor of a framework means the framework is imported already: nothing is imported here.
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    storages, arrays = [], []
    for k, v in tensors.items():
        if torch is not None and isinstance(v, torch.Tensor):
            if v.device.type == "meta" or _lazy(v):
                continue
            try:
                storage = v.untyped_storage()
            except AttributeError:
                storage = v.storage()
            ptr, size = storage.data_ptr(), storage.nbytes()
            if ptr != 0 and size != 0:
                storages.append((k, f"{v.device}/{ptr}/{size}", v.data_ptr(), v.element_size(), v.shape, v.stride()))
        elif np is not None and isinstance(v, np.ndarray):
            arrays.append((k, "", v.__array_interface__["data"][0], v.itemsize, v.shape, v.strides))
    _gdskit.check_shared_memory(storages, arrays)


def _prepare(tensors, staging_bytes):
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] or [str, numpy.ndarray] but received {type(tensors)}")
    torch, np = _frameworks.torch(), _frameworks.numpy()
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensor names must be str, not {type(k).__name__} ({k!r})")
        _utf8(k, "tensor name")
        is_torch = torch is not None and isinstance(v, torch.Tensor)
        if not is_torch and not (np is not None and isinstance(v, np.ndarray)):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor or numpy.ndarray but received {type(v)}")
        if is_torch and v.layout != torch.strided:
            raise ValueError(f"You are trying to save a sparse tensor: `{k}` which this library does not"
                             " support. You can make it a dense tensor before saving with `.to_dense()`.")
        if k == "__metadata__":
            raise ValueError("`__metadata__` is reserved and cannot name a tensor")
    if isinstance(staging_bytes, bool) or not isinstance(staging_bytes, int) or staging_bytes <= 0:
        raise ValueError(f"staging_bytes must be a positive int, not {staging_bytes!r}")
    _check_shared(tensors)
    keep, entries, cuda_devices = [], [], set()
    for k, v in tensors.items():
        if torch is not None and isinstance(v, torch.Tensor):
            e = _torch_entry(torch, k, v, staging_bytes, keep)
            if e[6] >= 0:
                cuda_devices.add(e[6])
        else:
            e = _numpy_entry(np, k, v, staging_bytes, keep)
        entries.append(e)
    # Kernels still writing the tensors finish first: the save reads device memory outside torch's streams.
    for d in cuda_devices:
        torch.cuda.synchronize(d)
    return entries, keep


def _metadata(metadata):
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, not {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str; {k!r}: {v!r} does not")
        _utf8(k, "metadata key")
        _utf8(v, "metadata value")
    return list(metadata.items())


def _interruptible(save):
    """save(signal_fd) on this thread, stopped by a signal (Ctrl-C): the compiled save watches `signal_fd`, which
    Python's signal handling writes to, stops between pieces (publishing nothing) and runs the handler, whose
    exception (KeyboardInterrupt) propagates. A signal whose handler raises nothing (a SIGCHLD handler, say)
    only restarts the save. Off the main thread, where Python runs no handlers, the save is not watched.
    Afterwards a shape the save learned is said in one line (GDSKIT_LEARN)."""
    try:
        return _watched(save)
    except FileExistsError as e:
        # Where the engine says overwrite was not set, that is a keyword argument here; any other EEXIST is
        # said as it came.
        if "overwrite not set" not in str(e):
            raise
        raise FileExistsError(e.errno, "save: exists; overwrite=True replaces it", e.filename) from None
    finally:
        _say_learned()


def _watched(save):
    if threading.current_thread() is not threading.main_thread():
        return save(-1)
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        try:
            while True:
                try:
                    return save(r)
                except OSError as e:
                    if e.errno != _errno.ECANCELED or not _pass_on(r, previous):
                        raise
        finally:
            signal.set_wakeup_fd(previous)
            _pass_on(r, previous)
    finally:
        os.close(r)
        os.close(w)


def _pass_on(r: int, previous: int) -> bool:
    """Empties the wakeup pipe into the descriptor that was Python's before (an event loop's); whether any
    signal had arrived."""
    seen = b""
    while True:
        try:
            chunk = os.read(r, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        seen += chunk
    if seen and previous >= 0:
        try:
            os.write(previous, seen)
        except OSError:
            pass
    return bool(seen)


def save_file(tensors, filename, metadata=None, *, overwrite: bool = True, staging_bytes: int = STAGING_BYTES):
    """Saves {name: tensor} to `filename` in the safetensors format, like safetensors.torch.save_file (and
    safetensors.numpy.save_file for numpy arrays), with the same bytes.

    Tensors: torch tensors on the CPU (written from their memory, no copy) or CUDA devices (written straight
    from device memory through pinned staging), or numpy arrays. Non-contiguous ones are made contiguous a block
    of rows at a time within `staging_bytes`, as are conjugate and negative views (c.conj(), torch._neg_view),
    which are written as their values. Tensors whose memory overlaps are refused (RuntimeError), as
    safetensors does. metadata: {str: str}, written in its order. Names and metadata must be UTF-8 text
    (ValueError for a str with a lone surrogate).

    The file appears under `filename` only once whole and synced to disk. An existing file is replaced
    atomically, as safetensors replaces it: until the new file is complete the old one stays whole, and an
    error or interruption leaves it as it was and no temporary file. overwrite=False refuses to replace it
    (FileExistsError). Checked before any tensor is read: a missing folder (FileNotFoundError) or a folder at
    `filename` (IsADirectoryError), naming `filename`. Raises ValueError / TypeError for bad arguments and OSError
    subclasses (with .filename) for I/O errors. Statistics: gdskit.last_save_stats().
    """
    global _last_save_stats
    md = _metadata(metadata)
    entries, keep = _prepare(tensors, staging_bytes)
    stats = _interruptible(lambda fd: _gdskit.save(os.fspath(filename), entries, md, bool(overwrite), False, 1, fd))
    del keep
    _last_save_stats = stats
    return None


def save(tensors, metadata=None) -> bytes:
    """The bytes of the safetensors file save_file would write for {name: tensor}, as safetensors.torch.save
    returns them (tensors in any memory save_file takes; CUDA tensors are copied to the host)."""
    entries, keep = _prepare(tensors, STAGING_BYTES)
    out = _gdskit.save_bytes(entries, _metadata(metadata))
    del keep
    return out


def load(data) -> dict:
    """{name: torch.Tensor} (CPU, in the file's data order) from the bytes of a safetensors file, as
    safetensors.torch.load gives them. data: bytes, bytearray or memoryview; the tensors own a copy of their
    bytes. A malformed file raises SafetensorError."""
    torch = _frameworks.torch(required="gdskit.load")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, bytearray or memoryview, not {type(data).__name__}")

    def allocate(nbytes):
        buf = torch.empty(nbytes, dtype=torch.uint8)
        return buf.data_ptr(), nbytes, buf

    tensors, _ = _gdskit.load_bytes(data, allocate)
    return {k: _frameworks.from_tensor("pt", v) for k, v in tensors.items()}


def save_sharded(tensors, folder, max_shard_size="5GB", metadata=None, overwrite: bool = False, *,
                 staging_bytes: int = STAGING_BYTES):
    """Saves {name: tensor} into `folder` (created if missing) as a Hugging Face sharded checkpoint:
    model-0000k-of-0000n.safetensors files of at most max_shard_size bytes of tensor data each (split in the
    order of the dict the way huggingface_hub splits; a tensor larger than the limit gets a shard of its own)
    and model.safetensors.index.json, written last. A single shard is model.safetensors with no index.
    max_shard_size: bytes, or "5GB"/"500MB" (decimal units) or "2GiB" (binary). Tensors, metadata (written into
    every shard), errors: as save_file. An existing checkpoint is replaced only with overwrite=True (the index
    always names one whole checkpoint, old or new), else FileExistsError. Shards of an earlier checkpoint that
    the new index does not name are left in place. Returns the final file names (shards, then the index).
    """
    global _last_save_stats
    limit = parse_shard_size(max_shard_size)
    md = _metadata(metadata)
    entries, keep = _prepare(tensors, staging_bytes)
    stats = _interruptible(lambda fd: _gdskit.save(os.fspath(folder), entries, md, bool(overwrite), True, limit, fd))
    del keep
    _last_save_stats = stats
    return list(stats["written"])
