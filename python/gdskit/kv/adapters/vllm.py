"""vLLM KV offloading to a gdskit block store: an OffloadingSpec for vLLM's OffloadingConnector.

    vllm serve <model> --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "GdskitOffloadingSpec",
            "spec_module_path": "gdskit.kv.adapters.vllm", "block_size": 128,
            "path": "/nvme/vllm-kv", "capacity_gb": 400, "num_blocks": 100000}}'

Written for the OffloadingSpec interface of vLLM 0.11-0.13 (get_manager on the scheduler, get_handlers on each
worker); later releases changed that interface. The scheduler side (GdskitOffloadingManager) keeps the index
of what is offloaded, with room for num_blocks offloaded blocks, and evicts least recently used blocks; it does
no I/O. The worker side (one store per rank, in the subfolder rank<r>of<world> of each folder) moves blocks:
an offloaded block (block_size tokens, a multiple of vLLM's own block size) is one store block holding those
tokens of every layer, K and V, gathered on the GPU into a staging tensor and written from GPU memory.

vLLM 0.11-0.13 stop on a transfer that fails, so nothing the scheduler counts on may vanish: the worker pins
every block it stores and unpins it when the scheduler evicts it, so the store's own capacity eviction never
takes a block the scheduler still lists (num_blocks x bytes per block must fit in the capacity; the worker checks
it at start). Transfers go in batches of at most max_batch_mib (default 256) so each finishes well within the
store's deadline (deadline_s, default 10 s here). A device error or a block that fails its checksum still fails
the job.

Extra config fields: path (a folder or a list of folders, striped), capacity_bytes or capacity_gb (per rank),
num_blocks (required), namespace, durability ("cache" or "persist"), deadline_s, max_batch_mib. The store
namespace always holds the model, cache dtype, KV layout, block sizes and rank.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import logging
import queue
import threading
import time

from ._common import capacity_from, config_value, open_store, outcome_mask, rank_folder, store_key
from ._engine import engine_attr

__all__ = ["GdskitOffloadingSpec", "GdskitOffloadingManager", "GdskitLoadStoreSpec", "GdskitOffloadingHandler",
           "MEDIUM"]

_log = logging.getLogger(__name__)

MEDIUM = "GDSKIT"
_WHERE = "vLLM kv_connector_extra_config"


# Minimal local bases used when vLLM is not installed (the module then imports, and its parts can be used on
# their own); with vLLM installed the adapter subclasses vLLM's own classes.
class _LoadStoreSpec:
    pass


class _BlockIDsLoadStoreSpec(_LoadStoreSpec):
    def __init__(self, block_ids):
        self.block_ids = list(block_ids)


class _GPULoadStoreSpec(_BlockIDsLoadStoreSpec):
    @staticmethod
    def medium() -> str:
        return "GPU"


@dataclasses.dataclass
class _PrepareStoreOutput:
    block_hashes_to_store: list
    store_spec: object
    block_hashes_evicted: list


@dataclasses.dataclass
class _OffloadingEvent:
    block_hashes: list
    block_size: int
    medium: str
    removed: bool


class _SpecBase:
    def __init__(self, vllm_config, kv_cache_config=None):
        self.vllm_config = vllm_config
        self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.gpu_block_size = vllm_config.cache_config.block_size
        self.offloaded_block_size = int(self.extra_config.get("block_size", self.gpu_block_size))


_ABSTRACT = "vllm.v1.kv_offload.abstract"
_MEDIUMS = "vllm.v1.kv_offload.mediums"
_WORKER = "vllm.v1.kv_offload.worker.worker"
_OffloadingManager = engine_attr(_ABSTRACT, "OffloadingManager", object)
_PrepareStore = engine_attr(_ABSTRACT, "PrepareStoreOutput", _PrepareStoreOutput)
_Event = engine_attr(_ABSTRACT, "OffloadingEvent", _OffloadingEvent)
_BlockIDsSpec = engine_attr(_MEDIUMS, "BlockIDsLoadStoreSpec", _BlockIDsLoadStoreSpec)
_GPUSpec = engine_attr(_MEDIUMS, "GPULoadStoreSpec", _GPULoadStoreSpec)
_OffloadingSpec = engine_attr("vllm.v1.kv_offload.spec", "OffloadingSpec", _SpecBase)
_OffloadingHandler = engine_attr(_WORKER, "OffloadingHandler", object)
_TransferResult = engine_attr(_WORKER, "TransferResult", None)


def _block_key(block_hash) -> bytes:
    if isinstance(block_hash, (bytes, int)):
        return store_key("vllm-block", block_hash)
    return store_key("vllm-block", repr(block_hash))


class GdskitLoadStoreSpec(_BlockIDsSpec):
    """Where offloaded blocks are: their store keys (block_ids are positions, for vLLM's own accounting), and
    for a store, the keys the scheduler evicted to make room (the worker unpins them)."""

    def __init__(self, keys, evicted_keys=()):
        super().__init__(list(range(len(keys))))
        self.keys = list(keys)
        self.evicted_keys = list(evicted_keys)

    @staticmethod
    def medium() -> str:
        return MEDIUM

    def __repr__(self) -> str:
        return f"GdskitLoadStoreSpec({len(self.keys)} blocks, {len(self.evicted_keys)} evicted)"


class _Entry:
    __slots__ = ("ready", "readers")

    def __init__(self):
        self.ready = False   # stored (complete_store came) and loadable
        self.readers = 0     # loads in flight (prepare_load without complete_load)


class GdskitOffloadingManager(_OffloadingManager):
    """The scheduler-side index: which block hashes are offloaded, in least-recently-used order, with room for
    num_blocks. Blocks being stored or loaded are never evicted."""

    def __init__(self, num_blocks: int, block_size: int, enable_events: bool = False):
        if num_blocks <= 0:
            raise ValueError(f"{_WHERE}: 'num_blocks' must be positive")
        self._capacity = num_blocks
        self._block_size = block_size
        self._blocks = collections.OrderedDict()  # block hash -> _Entry, least recently used first
        self._events = [] if enable_events else None

    def lookup(self, block_hashes) -> int:
        n = 0
        for h in block_hashes:
            e = self._blocks.get(h)
            if e is None or not e.ready:
                break
            n += 1
        return n

    def prepare_load(self, block_hashes):
        hashes = list(block_hashes)
        for h in hashes:
            e = self._blocks.get(h)
            if e is None or not e.ready:
                raise KeyError(f"block {h!r} is not offloaded (prepare_load follows lookup)")
        for h in hashes:
            self._blocks[h].readers += 1
        return GdskitLoadStoreSpec([_block_key(h) for h in hashes])

    def touch(self, block_hashes):
        # The first blocks of a prompt end up most recent: a prefix is worth more than its tail.
        for h in reversed(list(block_hashes)):
            if h in self._blocks:
                self._blocks.move_to_end(h)

    def complete_load(self, block_hashes):
        for h in block_hashes:
            e = self._blocks.get(h)
            if e is not None and e.readers > 0:
                e.readers -= 1

    def prepare_store(self, block_hashes):
        hashes = list(block_hashes)
        wanted = set(hashes)
        to_store = list(dict.fromkeys(h for h in hashes if h not in self._blocks))
        need = len(to_store) - (self._capacity - len(self._blocks))
        evicted = []
        if need > 0:
            for h, e in self._blocks.items():
                if e.ready and e.readers == 0 and h not in wanted:
                    evicted.append(h)
                    if len(evicted) == need:
                        break
            if len(evicted) < need:
                return None
            for h in evicted:
                del self._blocks[h]
            self._event(evicted, removed=True)
        for h in to_store:
            self._blocks[h] = _Entry()
        spec = GdskitLoadStoreSpec([_block_key(h) for h in to_store], [_block_key(h) for h in evicted])
        return _PrepareStore(block_hashes_to_store=to_store, store_spec=spec, block_hashes_evicted=evicted)

    def complete_store(self, block_hashes, success: bool = True):
        stored = []
        for h in block_hashes:
            e = self._blocks.get(h)
            if e is None or e.ready:
                continue
            if success:
                e.ready = True
                stored.append(h)
            else:
                del self._blocks[h]
        self._event(stored, removed=False)

    def take_events(self):
        if not self._events:
            return
        events, self._events = self._events, []
        yield from events

    def _event(self, hashes, removed: bool):
        if self._events is not None and hashes:
            self._events.append(_Event(block_hashes=list(hashes), block_size=self._block_size, medium=MEDIUM,
                                       removed=removed))


def _transfer_result(job_id, success, nbytes, seconds, kind):
    if _TransferResult is not None and dataclasses.is_dataclass(_TransferResult):
        return _TransferResult(job_id=job_id, success=success, transfer_size=nbytes, transfer_time=seconds,
                               transfer_type=kind)
    return (job_id, success)


class _Layout:
    """The GPU KV cache as per-block rows: each view is a tensor whose first dimension is vLLM's block id. An
    offloaded block is `factor` GPU blocks; its bytes, in order: for each of those GPU blocks, each view's row."""

    def __init__(self, views, factor: int):
        self.views = views
        self.factor = factor
        self.row_bytes = [v[0].numel() * v.element_size() for v in views]
        self.offsets = [sum(self.row_bytes[:i]) for i in range(len(views))]
        self.gpu_block_bytes = sum(self.row_bytes)
        self.block_bytes = factor * self.gpu_block_bytes
        self.device = views[0].device

    def gather(self, torch, gpu_ids, stream):
        """A uint8 staging tensor [len(gpu_ids) // factor, block_bytes] of those GPU blocks."""
        # Everything on our stream, the index upload included: the stream already waits for the engine's.
        with _on(torch, stream):
            ids = torch.as_tensor(gpu_ids, dtype=torch.int64).to(self.device)
            rows = torch.empty((len(ids), self.gpu_block_bytes), dtype=torch.uint8, device=self.device)
            for v, off, nb in zip(self.views, self.offsets, self.row_bytes):
                rows[:, off:off + nb].copy_(v.index_select(0, ids).reshape(len(ids), -1).view(torch.uint8))
        return rows.view(len(ids) // self.factor, self.block_bytes)

    def scatter(self, torch, staging, gpu_ids, skip: int, stream):
        """Writes staging rows into the GPU blocks gpu_ids, dropping the first `skip` GPU blocks' worth."""
        rows = staging.view(-1, self.gpu_block_bytes)[skip:]
        with _on(torch, stream):
            ids = torch.as_tensor(gpu_ids, dtype=torch.int64).to(self.device)
            for v, off, nb in zip(self.views, self.offsets, self.row_bytes):
                part = rows[:, off:off + nb].contiguous().view(v.dtype).view((len(ids),) + tuple(v.shape[1:]))
                v.index_copy_(0, ids, part)


def _on(torch, stream):
    """`torch.cuda.stream(stream)`, or nothing for CPU tensors."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class _Transfers:
    """The worker side shared by both directions: the store, the layout, a CUDA stream (GPU caches) and the
    thread that runs stores one after another (a block is pinned before the next store can evict it)."""

    def __init__(self, store, layout, max_batch_blocks: int):
        import torch  # noqa: PLC0415

        self.torch = torch
        self.store = store
        self.layout = layout
        self.max_batch = max(1, max_batch_blocks)
        self.stream = torch.cuda.Stream(device=layout.device) if layout.device.type == "cuda" else None
        self.lock = threading.Lock()
        self.finished = []       # results of store jobs, ready for get_finished
        self.store_jobs = {}     # job id -> threading.Event set when its result is in `finished`
        self.queue = queue.Queue()
        self.thread = threading.Thread(target=self._store_loop, name="gdskit-vllm-store", daemon=True)
        self.thread.start()

    def event_after_current(self):
        """An event that completes when the copies queued on our stream so far are done (None on the CPU)."""
        if self.stream is None:
            return None
        ev = self.torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def _store_loop(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            job_id, staging, keys, evicted, event, start = item
            ok = False
            try:
                if event is not None:
                    event.synchronize()
                if evicted:
                    self.store.unpin(evicted)
                mask = []
                for i in range(0, len(keys), self.max_batch):
                    part = keys[i:i + self.max_batch]
                    mask += outcome_mask(self.store.put(part, staging[i:i + len(part)]), len(part), "vLLM store")
                stored = [k for k, m in zip(keys, mask) if m]
                if stored:
                    self.store.pin(stored)
                ok = len(stored) == len(keys)
                if not ok:
                    _log.error("vLLM store job %d: %d of %d blocks not stored", job_id, len(keys) - len(stored),
                               len(keys))
            except Exception:  # noqa: BLE001 -- reported as a failed job, never a dead thread
                _log.exception("vLLM store job %d failed", job_id)
            with self.lock:
                self.finished.append(_transfer_result(job_id, ok, staging.numel(), time.perf_counter() - start,
                                                      ("GPU", MEDIUM)))
                done = self.store_jobs.pop(job_id, None)
            if done is not None:
                done.set()

    def close(self):
        self.queue.put(None)
        self.thread.join()
        self.store.close()


class GdskitOffloadingHandler(_OffloadingHandler):
    """Moves blocks in one direction: GPU -> store (store=True) or store -> GPU."""

    def __init__(self, transfers: _Transfers, store: bool):
        self._t = transfers
        self._store = store
        self._loads = collections.OrderedDict()  # job id -> [futures, staging, gpu ids, skip, event, start]
        self._waited = []                        # results of loads finished by wait(), for get_finished

    def transfer_async(self, job_id: int, spec) -> bool:
        src, dst = spec
        t, layout, torch = self._t, self._t.layout, self._t.torch
        start = time.perf_counter()
        if self._store:
            gpu_ids = [int(x) for x in src.block_ids]
            if len(gpu_ids) != layout.factor * len(dst.keys):
                raise ValueError(f"store job {job_id}: {len(gpu_ids)} GPU blocks for {len(dst.keys)} blocks of "
                                 f"{layout.factor}")
            if t.stream is not None:
                # The copies read KV the model has just written on the engine's stream.
                t.stream.wait_stream(torch.cuda.current_stream(layout.device))
            staging = layout.gather(torch, gpu_ids, t.stream)
            with t.lock:
                t.store_jobs[job_id] = threading.Event()
            t.queue.put((job_id, staging, list(dst.keys), list(dst.evicted_keys), t.event_after_current(), start))
            return True
        gpu_ids = [int(x) for x in dst.block_ids]
        skip = layout.factor * len(src.keys) - len(gpu_ids)
        if not 0 <= skip < layout.factor:
            raise ValueError(f"load job {job_id}: {len(gpu_ids)} GPU blocks for {len(src.keys)} blocks of "
                             f"{layout.factor}")
        staging = torch.empty((len(src.keys), layout.block_bytes), dtype=torch.uint8, device=layout.device)
        futures = []
        for i in range(0, len(src.keys), t.max_batch):
            part = src.keys[i:i + t.max_batch]
            futures.append(t.store.submit_get(part, staging[i:i + len(part)]))
        self._loads[job_id] = [futures, staging, gpu_ids, skip, None, start]
        return True

    def get_finished(self) -> list:
        if self._store:
            with self._t.lock:
                out, self._t.finished = self._t.finished, []
            return out
        out, self._waited = self._waited, []
        for job_id in list(self._loads):
            result = self._advance(job_id, block=False)
            if result is not None:
                out.append(result)
        return out

    def wait(self, job_ids) -> None:
        """Blocks until the jobs of `job_ids` this handler runs are finished (get_finished then reports them)."""
        if self._store:
            with self._t.lock:
                events = [self._t.store_jobs.get(j) for j in job_ids]
            for ev in events:
                if ev is not None:
                    ev.wait()
            return
        for j in job_ids:
            if j in self._loads:
                self._waited.append(self._advance(j, block=True))

    def shutdown(self) -> None:
        if self._store:
            self._t.close()

    def _advance(self, job_id, block: bool):
        """Moves a load on: once its reads are done, queues the copies into the GPU blocks; once those are done
        (or at once when `block`), removes the job and returns its result. None while still running."""
        job = self._loads[job_id]
        futures, staging, gpu_ids, skip, event, start = job
        if event is None:
            if not block and not all(f.done() for f in futures):
                return None
            if not self._loaded(job_id, futures):
                del self._loads[job_id]
                return _transfer_result(job_id, False, 0, time.perf_counter() - start, (MEDIUM, "GPU"))
            self._t.layout.scatter(self._t.torch, staging, gpu_ids, skip, self._t.stream)
            job[4] = event = self._t.event_after_current() or True
        if event is not True:
            if block:
                event.synchronize()
            elif not event.query():
                return None
        del self._loads[job_id]
        return _transfer_result(job_id, True, staging.numel(), time.perf_counter() - start, (MEDIUM, "GPU"))

    def _loaded(self, job_id, futures) -> bool:
        hits = total = 0
        for f in futures:
            try:
                got = [bool(x) for x in f.result()]
            except Exception as e:  # noqa: BLE001 -- a failed batch fails the job
                _log.error("vLLM load job %d: %s", job_id, e)
                return False
            hits += sum(got)
            total += len(got)
        if hits != total:
            _log.error("vLLM load job %d: %d of %d blocks missing (evicted, failed checksum, I/O error or "
                       "deadline)", job_id, total - hits, total)
        return hits == total


class GdskitOffloadingSpec(_OffloadingSpec):
    """vLLM's OffloadingSpec for the gdskit block store: get_manager() on the scheduler, get_handlers() on each
    worker. Named in kv_connector_extra_config as spec_name/spec_module_path."""

    def __init__(self, vllm_config, kv_cache_config=None):
        base_params = [p for p in inspect.signature(_OffloadingSpec.__init__).parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(base_params) >= 3:
            super().__init__(vllm_config, kv_cache_config)
        else:
            super().__init__(vllm_config)
        gpu = self.gpu_block_size
        if isinstance(gpu, (tuple, list)):
            if len(gpu) != 1:
                raise ValueError("the gdskit offloading spec serves models with one KV cache group")
            gpu = gpu[0]
        self._gpu_block_tokens = int(gpu)
        self._factor = int(self.offloaded_block_size) // self._gpu_block_tokens
        if self._factor < 1 or self._factor * self._gpu_block_tokens != int(self.offloaded_block_size):
            raise ValueError(f"{_WHERE}: 'block_size' ({self.offloaded_block_size}) must be a multiple of vLLM's "
                             f"block size ({self._gpu_block_tokens})")
        extra = dict(self.extra_config or {})
        self._num_blocks = config_value(extra, "num_blocks", int, required=True, where=_WHERE)
        if self._num_blocks <= 0:
            raise ValueError(f"{_WHERE}: 'num_blocks' must be positive")
        self._extra = extra
        self._manager = None
        self._transfers = None

    def get_manager(self):
        if self._manager is None:
            events = getattr(self.vllm_config, "kv_events_config", None)
            self._manager = GdskitOffloadingManager(
                self._num_blocks, int(self.offloaded_block_size),
                enable_events=bool(events is not None and getattr(events, "enable_kv_cache_events", False)))
        return self._manager

    def get_handlers(self, kv_caches, attn_backends=None):
        if self._transfers is None:
            self._transfers = self._open(kv_caches, attn_backends)
        yield _GPUSpec, GdskitLoadStoreSpec, GdskitOffloadingHandler(self._transfers, store=True)
        yield GdskitLoadStoreSpec, _GPUSpec, GdskitOffloadingHandler(self._transfers, store=False)

    def _open(self, kv_caches, attn_backends):
        extra = self._extra
        views = _block_views(kv_caches, attn_backends, self.vllm_config)
        layout = _Layout(views, self._factor)
        capacity = capacity_from(extra, _WHERE)
        if self._num_blocks * layout.block_bytes > capacity:
            raise ValueError(f"{_WHERE}: num_blocks {self._num_blocks} x {layout.block_bytes} bytes per block "
                             f"exceeds the capacity of {capacity} bytes")
        rank, world = _rank()
        cache = self.vllm_config.cache_config
        model = getattr(getattr(self.vllm_config, "model_config", None), "model", "")
        shapes = ";".join(f"{tuple(v.shape[1:])}:{v.dtype}" for v in views)
        namespace = "|".join(["vllm", str(model), str(getattr(cache, "cache_dtype", "")), shapes,
                              f"gpu_block{self._gpu_block_tokens}", f"block{self.offloaded_block_size}",
                              f"rank{rank}of{world}", config_value(extra, "namespace", str, "", where=_WHERE)])
        store = open_store(rank_folder(config_value(extra, "path", list, required=True, where=_WHERE),
                                       f"rank{rank}of{world}"),
                           capacity_bytes=capacity, block_bytes=layout.block_bytes, namespace=namespace,
                           durability=config_value(extra, "durability", str, "cache", where=_WHERE),
                           deadline_s=config_value(extra, "deadline_s", float, 10.0, where=_WHERE))
        batch_mib = config_value(extra, "max_batch_mib", int, 256, where=_WHERE)
        _log.info("gdskit KV offload: %d views, %d bytes per block, store %s", len(views), layout.block_bytes,
                  namespace)
        return _Transfers(store, layout, (batch_mib << 20) // layout.block_bytes)


def _rank():
    try:
        import torch.distributed as dist  # noqa: PLC0415

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, 1


_SENTINEL_BLOCKS = 1234  # a block count no cache shape has by chance, to find the block dimension


def _block_views(kv_caches, attn_backends, vllm_config):
    """The per-layer KV tensors as views whose first dimension is the block id: (num_blocks, ...) tensors as
    they are, (2, num_blocks, ...) ones split into K and V. The layout comes from the attention backend when
    vLLM gives one, else from the block count in the cache config; anything else is refused."""
    if not kv_caches:
        raise ValueError("vLLM registered no KV caches")
    num_blocks = getattr(getattr(vllm_config, "cache_config", None), "num_gpu_blocks", None)
    views = []
    for name, t in kv_caches.items():
        kv_first = None
        backend = (attn_backends or {}).get(name)
        if backend is not None:
            shape = tuple(backend.get_kv_cache_shape(num_blocks=_SENTINEL_BLOCKS, block_size=16, num_kv_heads=8,
                                                     head_size=256))
            if len(shape) == t.dim() and shape[0] == _SENTINEL_BLOCKS:
                kv_first = False
            elif len(shape) == t.dim() and shape[:2] == (2, _SENTINEL_BLOCKS):
                kv_first = True
        elif num_blocks:
            if t.shape[0] == num_blocks:
                kv_first = False
            elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                kv_first = True
        if kv_first is None:
            raise ValueError(f"cannot tell the block dimension of KV cache {name!r} of shape {tuple(t.shape)}")
        views.extend([t[0], t[1]] if kv_first else [t])
    return views
