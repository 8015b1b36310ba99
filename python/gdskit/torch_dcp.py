"""A storage backend for PyTorch Distributed Checkpoint (torch.distributed.checkpoint, torch >= 2.1) whose file
I/O runs through gdskit: tensors are written and read as raw bytes straight from and into their memory (GPU
memory through gdskit's staged pinned lanes and O_DIRECT), every data file is written under a temporary name,
synced and renamed into place, and the metadata is published last.

    import torch.distributed.checkpoint as dcp
    import gdskit.torch as gt
    dcp.save(state_dict, storage_writer=gt.FileSystemWriter("/ckpt/step-1000"))
    dcp.load(state_dict, storage_reader=gt.FileSystemReader("/ckpt/step-1000"))

The writer's data files are named __<rank>_<n>.gdskit.distcp and hold each item's bytes at 4 KiB-aligned
offsets (tensors in C order, byte items as they are); the .metadata file is torch's own. gdskit's reader reads
those files and hands items of checkpoints written by torch's own writer to torch's reader, so it reads both;
torch's reader cannot read gdskit's data files. See docs/distributed.md.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
import io
import os
import time

import torch

try:
    from torch.distributed.checkpoint import filesystem as _fs
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future
except (ImportError, ValueError) as _e:  # torch 1.x: no (or, on newer Pythons, a broken) checkpoint package
    raise ImportError(f"gdskit.torch needs torch >= 2.1 with torch.distributed.checkpoint; this is torch "
                      f"{torch.__version__} ({type(_e).__name__}: {_e})") from _e

from . import _gdskit

__all__ = ["FileSystemWriter", "FileSystemReader", "SUFFIX", "last_stats"]

SUFFIX = ".gdskit.distcp"
_ALIGN = 4096
_last_stats: dict = {}


def last_stats() -> dict:
    """This rank's last write_data or read_data: bytes, files, seconds, sync_seconds."""
    return dict(_last_stats)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _device_of(t: torch.Tensor) -> int:
    if t.device.type == "cpu":
        return -1
    if t.device.type != "cuda":
        raise OSError(_errno.ENOTSUP, f"gdskit checkpoint: tensors on {t.device.type} are not supported")
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _plain_bytes(t: torch.Tensor) -> torch.Tensor:
    """A dense, C-ordered tensor with t's values whose bytes can be written as they are."""
    if t.is_sparse or t.is_quantized or t.layout != torch.strided:
        raise OSError(_errno.ENOTSUP, f"gdskit checkpoint: a {t.layout} tensor cannot be written as raw bytes")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


def _balance(items, bins, size):
    """Items into `bins` lists of about equal bytes (largest first into the lightest)."""
    if bins <= 1:
        return [list(items)]
    out, load = [[] for _ in range(bins)], [0] * bins
    for it in sorted(items, key=size, reverse=True):
        i = load.index(min(load))
        out[i].append(it)
        load[i] += size(it)
    return out


class FileSystemWriter(_fs.FileSystemWriter):
    """torch.distributed.checkpoint.FileSystemWriter with gdskit's file I/O (same arguments). A rank's items go
    into thread_count files (balanced by bytes), written together as one batch of gdskit's transfer core;
    sync_files=True fdatasyncs each data file before its rename and the folder after them (torch's own writer
    fsyncs its files but not the folder)."""

    def __init__(self, path, *args, **kwargs):
        fmt = kwargs.get("serialization_format")
        if fmt is not None and getattr(fmt, "value", fmt) != "torch_save":
            raise OSError(_errno.ENOTSUP, "gdskit checkpoint: only the default serialization format is supported")
        if kwargs.get("_extensions"):
            raise OSError(_errno.ENOTSUP, "gdskit checkpoint: stream extensions are not supported")
        super().__init__(path, *args, **kwargs)

    def write_data(self, plan, planner):
        global _last_stats
        t0 = time.perf_counter()
        prefix = plan.storage_data.prefix
        items = list(plan.items)
        if self.single_file_per_rank:
            groups = _balance(items, max(1, int(self.thread_count)), _item_bytes)
        else:
            groups = [[it] for it in items]
        files = [(f"{prefix}{i}{SUFFIX}", g) for i, g in enumerate(g for g in groups if g)]
        # The planner's resolve_data runs on this thread; then one call writes every file: all files' ranges in
        # one batch of the transfer core, each file under a temporary name, synced (sync_files) and renamed.
        staged = [(name, self._stage(name, g, planner)) for name, g in files]
        if any(dev >= 0 for _, (ranges, _, _) in staged for _, _, _, dev in ranges):
            torch.cuda.synchronize()
        written, sync_seconds = _gdskit.write_files(
            [(os.path.join(str(self.path), name), ranges) for name, (ranges, _, _) in staged], bool(self.sync_files))
        stats = {"bytes": written, "files": len(staged), "sync_seconds": sync_seconds}
        results = [r for _, (_, _, rs) in staged for r in rs]
        stats["seconds"] = time.perf_counter() - t0
        _last_stats = stats
        fut: Future = Future()
        fut.set_result(results)
        return fut

    @staticmethod
    def _stage(name, items, planner):
        """(ranges for write_ranges, the tensors they point into, the WriteResults)."""
        ranges, keep, results, off = [], [], [], 0
        for item in items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = bytearray(data.getbuffer())
                t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                keep.append(raw)
            else:
                t = _plain_bytes(data)
            nbytes = t.numel() * t.element_size()
            if nbytes:
                ranges.append((t.data_ptr(), nbytes, off, _device_of(t)))
            keep.append(t)
            results.append(WriteResult(index=item.index, size_in_bytes=nbytes,
                                       storage_data=_fs._StorageInfo(name, off, nbytes)))  # noqa: SLF001
            off = _align(off + nbytes)
        return ranges, keep, results


def _item_bytes(item) -> int:
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return 0
    n = 1
    for s in item.tensor_data.size:
        n *= s
    return n * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()


class FileSystemReader(_fs.FileSystemReader):
    """torch.distributed.checkpoint.FileSystemReader with gdskit's file I/O (same arguments). Items of gdskit's
    data files are read, only the bytes of the part of the stored chunk they need, as batches across all files:
    straight into their target tensors where the target is dense and of the chunk's dtype, else into a buffer
    copied into the target. Items of torch-written files go to torch's reader."""

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._gdskit_md = metadata

    def read_data(self, plan, planner):
        global _last_stats
        t0 = time.perf_counter()
        ours = [r for r in plan.items if self.storage_data[r.storage_index].relative_path.endswith(SUFFIX)]
        theirs = [r for r in plan.items if not self.storage_data[r.storage_index].relative_path.endswith(SUFFIX)]
        if theirs:
            super().read_data(dataclasses.replace(plan, items=theirs), planner).wait()
        per_file = {}
        for r in ours:
            per_file.setdefault(self.storage_data[r.storage_index].relative_path, []).append(r)
        total = 0
        cuda_synced = False
        # The planner runs on this thread: targets are resolved and their reads planned first, then every read
        # of every file runs as batches of the transfer core, then the items are committed here.
        reads, after = [], []
        for rel, reqs in per_file.items():
            path = os.path.join(str(self.path), rel)
            reqs.sort(key=lambda r: self.storage_data[r.storage_index].offset)
            for req in reqs:
                info = self.storage_data[req.storage_index]
                if req.type == LoadItemType.BYTE_IO:
                    with open(path, "rb") as f:
                        f.seek(info.offset)
                        raw = f.read(info.length)
                    if len(raw) != info.length:
                        raise OSError(_errno.EIO, f"gdskit checkpoint: {path} ends inside an item")
                    total += len(raw)
                    planner.load_bytes(req, io.BytesIO(raw))
                    continue
                target = planner.resolve_tensor(req).detach()
                if target.is_cuda and not cuda_synced:
                    torch.cuda.synchronize()  # the targets' allocations and initialisation are done
                    cuda_synced = True
                item, fix = self._plan_read(path, req, info, target)
                if item is not None:
                    reads.append(item)
                after.append((req, target, fix))
        if reads:
            total += _gdskit.read_slices(reads)
        for req, target, fix in after:
            if fix is not None:
                fix()
            planner.commit_tensor(req, target)
        _last_stats = {"bytes": total, "files": len(per_file), "seconds": time.perf_counter() - t0}
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _chunk(self, index):
        """(dtype, sizes) of the stored chunk an item's storage index names."""
        md = self._gdskit_md.state_dict_metadata[index.fqn]
        for c in md.chunks:
            if list(c.offsets) == list(index.offset):
                return md.properties.dtype, list(c.sizes)
        raise OSError(_errno.EBADMSG, f"gdskit checkpoint: no stored chunk of {index.fqn} at {list(index.offset)}")

    def _plan_read(self, path, req, info, target):
        """One tensor item as the compiled module's read_slices takes it: the stored chunk's part (offsets and
        lengths per dimension: a slice of the chunk) read straight into the target when it is dense and of the
        chunk's dtype, else into a buffer of the part that is copied into the target afterwards (the returned
        fix). (None, None) when there is nothing to read."""
        dtype, sizes = self._chunk(req.storage_index)
        elem = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for s in sizes:
            numel *= s
        if numel * elem != info.length:
            raise OSError(_errno.EBADMSG, f"gdskit checkpoint: item {req.storage_index.fqn} holds {info.length} "
                                          f"bytes, its chunk {sizes} of {dtype} needs {numel * elem}")
        if target.numel() == 0:
            return None, None
        picks = [(int(o), int(n), 1) for o, n in zip(req.storage_offsets, req.lengths)]
        dense = target.is_contiguous() and target.dtype == dtype and not target.is_conj() and not target.is_neg()
        into, fix = target, None
        if not dense:
            into = torch.empty([int(n) for n in req.lengths], dtype=dtype, device=target.device)

            def fix():
                target.copy_(into)
        return (path, info.offset, [int(x) for x in sizes], elem, picks, into.data_ptr(), into.numel() * elem,
                _device_of(into)), fix
