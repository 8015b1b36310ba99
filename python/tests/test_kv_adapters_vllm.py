#!/usr/bin/env python3
"""The vLLM adapter (gdskit.kv.adapters.vllm) driven the way vLLM's OffloadingConnector (0.11-0.13) drives an
OffloadingSpec, its manager and its transfer handlers.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_kv_adapters_vllm.py

vLLM is not installed here. The engine side below is a TEST STAND-IN written for these tests: the modules
vllm.v1.kv_offload.{abstract,mediums,spec,worker.worker} with the base classes the adapter subclasses (installed
in sys.modules before the adapter is imported), the spec factory (spec_name/spec_module_path, issubclass check),
the offloading worker (one handler per (src medium, dst medium)), and a scheduler and worker connector that make
the calls in the connector's order: touch and lookup when a request arrives, prepare_load after allocation,
prepare_store for newly computed blocks, transfer_async for loads before the forward pass and for stores after
it, get_finished every step (a failed job is an assertion, as in those releases), complete_store and
complete_load from the finished request ids. "GPU" KV caches are CPU tensors (and CUDA tensors where a GPU
is usable). The store is the real gdskit.kv.BlockStore on temporary folders, with the faults of kv_faults.py.
"""
import abc
import dataclasses
import hashlib
import importlib
import os
import subprocess
import sys
import time
import types
from collections import defaultdict

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")


# ---- TEST STAND-IN of vLLM's kv_offload modules (installed before the adapter is imported) --------------------

class LoadStoreSpec(abc.ABC):
    @staticmethod
    @abc.abstractmethod
    def medium() -> str:
        ...


@dataclasses.dataclass
class PrepareStoreOutput:
    block_hashes_to_store: list
    store_spec: LoadStoreSpec
    block_hashes_evicted: list


@dataclasses.dataclass
class OffloadingEvent:
    block_hashes: list
    block_size: int
    medium: str
    removed: bool


class OffloadingManager(abc.ABC):
    @abc.abstractmethod
    def lookup(self, block_hashes):
        ...

    @abc.abstractmethod
    def prepare_load(self, block_hashes):
        ...

    def touch(self, block_hashes):
        return

    def complete_load(self, block_hashes):
        return

    @abc.abstractmethod
    def prepare_store(self, block_hashes):
        ...

    def complete_store(self, block_hashes, success=True):
        return

    def take_events(self):
        return ()


class BlockIDsLoadStoreSpec(LoadStoreSpec, abc.ABC):
    def __init__(self, block_ids):
        self.block_ids = np.array(block_ids, dtype=np.int64)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    @staticmethod
    def medium():
        return "GPU"


class OffloadingSpec(abc.ABC):
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.gpu_block_size = vllm_config.cache_config.block_size
        self.offloaded_block_size = int(self.extra_config.get("block_size", self.gpu_block_size))
        assert self.offloaded_block_size % self.gpu_block_size == 0

    @abc.abstractmethod
    def get_manager(self):
        ...

    @abc.abstractmethod
    def get_handlers(self, kv_caches):
        ...


class OffloadingHandler(abc.ABC):
    @abc.abstractmethod
    def transfer_async(self, job_id, spec):
        ...

    @abc.abstractmethod
    def get_finished(self):
        ...


class OffloadingWorker:
    def __init__(self):
        self.handlers = set()
        self.by_type = {}

    def register_handler(self, src_cls, dst_cls, handler):
        kind = (src_cls.medium(), dst_cls.medium())
        assert kind not in self.by_type
        self.handlers.add(handler)
        self.by_type[kind] = handler

    def transfer_async(self, job_id, spec):
        src, dst = spec
        return self.by_type[(src.medium(), dst.medium())].transfer_async(job_id, spec)

    def get_finished(self):
        out = []
        for h in self.handlers:
            out.extend(h.get_finished())
        return out


def _install(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


for _pkg in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.worker"):
    sys.modules.setdefault(_pkg, types.ModuleType(_pkg))
_install("vllm.v1.kv_offload.abstract", LoadStoreSpec=LoadStoreSpec, PrepareStoreOutput=PrepareStoreOutput,
         OffloadingEvent=OffloadingEvent, OffloadingManager=OffloadingManager)
_install("vllm.v1.kv_offload.mediums", BlockIDsLoadStoreSpec=BlockIDsLoadStoreSpec, GPULoadStoreSpec=GPULoadStoreSpec)
_install("vllm.v1.kv_offload.spec", OffloadingSpec=OffloadingSpec)
_install("vllm.v1.kv_offload.worker.worker", OffloadingHandler=OffloadingHandler, OffloadingWorker=OffloadingWorker,
         TransferResult=tuple[int, bool])

try:
    from gdskit.kv.adapters import _common
    from gdskit.kv.adapters import vllm as adapter
except ImportError as e:  # pragma: no cover
    pytest.skip(f"SKIP: cannot import gdskit ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH", allow_module_level=True)
import kv_faults  # noqa: E402
from gdskit.kv import capacity_for  # noqa: E402

_common.store_class = kv_faults.Faulty


def create_spec(config):
    """vLLM's spec factory for a spec that is not built in."""
    extra = config.kv_transfer_config.kv_connector_extra_config
    cls = getattr(importlib.import_module(extra["spec_module_path"]), extra["spec_name"])
    assert issubclass(cls, OffloadingSpec)
    return cls(config)


# ---- TEST STAND-IN of the connector's scheduler and worker sides ----------------------------------------------

@dataclasses.dataclass
class Request:
    request_id: str
    tokens: list
    block_hashes: list        # one per GPU block of full tokens
    num_computed_tokens: int = 0

    @property
    def num_tokens(self):
        return len(self.tokens)


class Scheduler:
    """The scheduler side of the connector, in its call order."""

    def __init__(self, spec):
        self.gpu_block = spec.gpu_block_size
        self.block = spec.offloaded_block_size
        self.factor = self.block // self.gpu_block
        self.manager = spec.get_manager()
        self.reqs = {}
        self.block_ids = {}
        self.to_load = {}
        self.next_store = {}
        self.being_stored = defaultdict(set)
        self.being_loaded = defaultdict(set)

    def hashes(self, req, start=0, end=None):
        # The last GPU block hash of each offloaded block identifies it.
        f = self.factor
        return req.block_hashes[f * start + f - 1:f * end if end else None:f]

    def num_new_matched_tokens(self, req, computed):
        n_blocks = req.num_tokens // self.block
        self.manager.touch(self.hashes(req))
        if self.block * n_blocks - computed < self.block:
            return 0, False
        start = computed // self.block
        hits = self.manager.lookup(self.hashes(req, start))
        if hits == 0:
            return 0, False
        tokens = self.block * (start + hits) - computed
        return (tokens, True) if tokens >= self.block else (0, False)

    def after_alloc(self, req, gpu_ids, computed_gpu_blocks, external_tokens):
        self.reqs[req.request_id] = req
        self.block_ids[req.request_id] = []
        if external_tokens == 0:
            return
        computed = computed_gpu_blocks * self.gpu_block
        full = computed + external_tokens
        assert full % self.block == 0
        assert external_tokens == (len(gpu_ids) - computed_gpu_blocks) * self.gpu_block
        start, end = computed // self.block, full // self.block
        src = self.manager.prepare_load(self.hashes(req, start, end))
        self.to_load[req.request_id] = (src, GPULoadStoreSpec(gpu_ids[computed_gpu_blocks:]))
        self.being_loaded[req.request_id].update(self.hashes(req, start, end))
        self.next_store[req.request_id] = end

    def build_meta(self, scheduled):
        """scheduled: {req id: (new GPU block ids, tokens scheduled this step)}."""
        to_store = {}
        for rid, (new_ids, n_tokens) in scheduled.items():
            self.block_ids[rid] += new_ids
            ids = self.block_ids[rid]
            req = self.reqs[rid]
            n_blocks = (req.num_computed_tokens + n_tokens) // self.block
            start = self.next_store.get(rid, 0)
            if n_blocks - start <= 0:
                continue
            out = self.manager.prepare_store(self.hashes(req, start, n_blocks))
            if out is None:
                continue
            self.next_store[rid] = n_blocks
            if not out.block_hashes_to_store:
                continue
            wanted = set(out.block_hashes_to_store)
            self.manager.touch(self.hashes(req, 0, n_blocks))
            src = []
            for i, h in enumerate(self.hashes(req, start, n_blocks)):
                if h in wanted:
                    g = (start + i) * self.factor
                    src += ids[g:g + self.factor]
            to_store[rid] = (GPULoadStoreSpec(src), out.store_spec)
            self.being_stored[rid] |= wanted
        meta = {"load": self.to_load, "store": to_store}
        self.to_load = {}
        return meta

    def connector_output(self, sending, recving):
        for rid in sending:
            hs = self.being_stored.pop(rid, None)
            if hs:
                self.manager.complete_store(hs)
        for rid in recving:
            hs = self.being_loaded.pop(rid, None)
            if hs:
                self.manager.complete_load(hs)

    def finished(self, req):
        for d in (self.reqs, self.block_ids, self.next_store):
            d.pop(req.request_id, None)
        return req.request_id in self.being_stored


class Worker:
    """The worker side of the connector."""

    def __init__(self, spec, kv_caches):
        self.worker = OffloadingWorker()
        for src, dst, handler in spec.get_handlers(kv_caches):
            self.worker.register_handler(src, dst, handler)
        self.next_job = 0
        self.jobs = {}
        self.load_job = {}
        self.store_jobs = defaultdict(set)
        self.waiting_for_store = set()

    def _job(self):
        self.next_job += 1
        return self.next_job

    def start_load(self, meta):
        for rid, spec in meta["load"].items():
            assert isinstance(spec[0], BlockIDsLoadStoreSpec)
            j = self._job()
            self.jobs[j] = (rid, False)
            self.load_job[rid] = j
            assert self.worker.transfer_async(j, spec)

    def start_store(self, meta):
        for rid, spec in meta["store"].items():
            assert isinstance(spec[1], BlockIDsLoadStoreSpec)
            j = self._job()
            self.jobs[j] = (rid, True)
            self.store_jobs[rid].add(j)
            assert self.worker.transfer_async(j, spec)

    def get_finished(self, finished_req_ids):
        sending, recving = set(), set()
        for job_id, success in self.worker.get_finished():
            assert success, f"transfer job {job_id} failed"  # vLLM 0.11-0.13 do not handle failed jobs
            rid, store = self.jobs.pop(job_id)
            if store:
                self.store_jobs[rid].remove(job_id)
                if self.store_jobs[rid]:
                    continue
                if rid in self.waiting_for_store:
                    self.waiting_for_store.remove(rid)
                    sending.add(rid)
                    del self.store_jobs[rid]
            else:
                del self.load_job[rid]
                recving.add(rid)
        for rid in finished_req_ids:
            pending = self.store_jobs.get(rid)
            if pending:
                self.waiting_for_store.add(rid)
            elif pending is not None:
                sending.add(rid)
                del self.store_jobs[rid]
        return sending, recving


# ---- the simulated engine ---------------------------------------------------------------------------------------

GPU_BLOCK = 4   # tokens per vLLM block
LAYERS, HEADS, DIM = 3, 2, 8


def _ns(**kw):
    return types.SimpleNamespace(**kw)


def _config(tmp, *, block_size=8, num_blocks=64, capacity_blocks=None, num_gpu_blocks=48, **extra):
    e = {"spec_name": "GdskitOffloadingSpec", "spec_module_path": "gdskit.kv.adapters.vllm",
         "block_size": block_size, "path": tmp, "num_blocks": num_blocks}
    e.update(extra)
    if "capacity_bytes" not in e and "capacity_gb" not in e:
        e["capacity_bytes"] = capacity_for(capacity_blocks or num_blocks, _block_bytes(block_size))
    return _ns(kv_transfer_config=_ns(kv_connector_extra_config=e),
               cache_config=_ns(block_size=GPU_BLOCK, num_gpu_blocks=num_gpu_blocks, cache_dtype="auto"),
               model_config=_ns(model="test/llama"), kv_events_config=_ns(enable_kv_cache_events=True))


def _block_bytes(block_size):
    return (block_size // GPU_BLOCK) * LAYERS * 2 * GPU_BLOCK * HEADS * DIM * 2


def _caches(num_gpu_blocks, kv_first=True, device="cpu"):
    shape = (2, num_gpu_blocks, GPU_BLOCK, HEADS, DIM) if kv_first else (num_gpu_blocks, 2, GPU_BLOCK, HEADS, DIM)
    return {f"model.layers.{i}.self_attn": torch.zeros(shape, dtype=torch.bfloat16, device=device)
            for i in range(LAYERS)}


def _block_hashes(tokens):
    out, prev = [], b""
    for i in range(len(tokens) // GPU_BLOCK):
        prev = hashlib.sha256(prev + repr(tokens[i * GPU_BLOCK:(i + 1) * GPU_BLOCK]).encode()).digest()
        out.append(prev)
    return out


class Engine:
    """Requests, a free list of GPU blocks, and the KV the "model" computes: the contents of a GPU block are a
    function of its block hash, so a loaded block can be checked against what the model would compute."""

    def __init__(self, tmp, kv_first=True, num_gpu_blocks=48, device="cpu", **cfg):
        self.config = _config(tmp, num_gpu_blocks=num_gpu_blocks, **cfg)
        self.sched_spec = create_spec(self.config)      # scheduler process
        self.worker_spec = create_spec(self.config)     # worker process
        self.kv_first = kv_first
        self.caches = _caches(num_gpu_blocks, kv_first, device)
        self.sched = Scheduler(self.sched_spec)
        self.worker = Worker(self.worker_spec, self.caches)
        self.free = list(range(num_gpu_blocks))

    def views(self):
        out = []
        for t in self.caches.values():
            out += [t[0], t[1]] if self.kv_first else [t]
        return out

    def compute(self, gpu_id, block_hash):
        g = torch.Generator().manual_seed(int.from_bytes(block_hash[:8], "little"))
        for v in self.views():
            v[gpu_id].copy_(torch.randn(v[gpu_id].shape, generator=g).to(v.dtype).to(v.device))

    def check(self, gpu_id, block_hash):
        g = torch.Generator().manual_seed(int.from_bytes(block_hash[:8], "little"))
        for v in self.views():
            want = torch.randn(v[gpu_id].shape, generator=g).to(v.dtype)
            assert torch.equal(v[gpu_id].cpu().view(torch.int16), want.view(torch.int16)), f"GPU block {gpu_id} differs"

    def run(self, req, gpu_prefix_blocks=0, steps=200):
        """Schedules a request whole (one prefill step), runs its transfers to completion and finishes it.
        gpu_prefix_blocks: leading GPU blocks already in vLLM's own prefix cache. Returns (tokens loaded,
        GPU block ids)."""
        computed = gpu_prefix_blocks * GPU_BLOCK
        ext, is_async = self.sched.num_new_matched_tokens(req, computed)
        n_gpu = len(req.block_hashes)
        ids = [self.free.pop(0) for _ in range(n_gpu)]
        for i in range(gpu_prefix_blocks):
            self.compute(ids[i], req.block_hashes[i])
        self.sched.after_alloc(req, ids[:gpu_prefix_blocks + ext // GPU_BLOCK], gpu_prefix_blocks, ext)
        meta = self.sched.build_meta({})
        self.worker.start_load(meta)
        loaded = set()
        for _ in range(steps):
            sending, recving = self.worker.get_finished(set())
            self.sched.connector_output(sending, recving)
            loaded |= recving
            if not is_async or req.request_id in loaded:
                break
            time.sleep(0.005)
        assert not is_async or req.request_id in loaded, "the load never finished"
        req.num_computed_tokens = computed + ext
        for i in range(gpu_prefix_blocks + ext // GPU_BLOCK, n_gpu):  # the forward pass computes the rest
            self.compute(ids[i], req.block_hashes[i])
        meta = self.sched.build_meta({req.request_id: (ids, req.num_tokens - req.num_computed_tokens)})
        self.worker.start_store(meta)
        req.num_computed_tokens = req.num_tokens
        assert self.sched.finished(req) == (req.request_id in self.sched.being_stored)
        finished = {req.request_id}
        for _ in range(steps):
            sending, recving = self.worker.get_finished(finished)
            finished = set()
            self.sched.connector_output(sending, recving)
            if req.request_id not in self.sched.being_stored:
                break
            time.sleep(0.005)
        assert req.request_id not in self.sched.being_stored, "the store never finished"
        return ext, ids

    def release(self, ids):
        for i in ids:
            for v in self.views():
                v[i].fill_(0)
        self.free = sorted(self.free + list(ids))


def _fresh():
    kv_faults.reset()
    return kv_faults.fresh_folder("kv-vllm-")


def _request(rid, tokens):
    return Request(rid, list(tokens), _block_hashes(tokens))


# ---- tests ----------------------------------------------------------------------------------------------------

def _store_then_load(kv_first, device="cpu"):
    eng = Engine(_fresh(), kv_first=kv_first, device=device)
    prompt = list(range(1000, 1040))                       # 10 GPU blocks = 5 offloaded blocks
    a = _request("a", prompt)
    ext, ids = eng.run(a)
    assert ext == 0
    eng.release(ids)
    b = _request("b", prompt + list(range(7, 15)))          # same prefix, 2 more GPU blocks
    ext, ids = eng.run(b)
    assert ext == 40, ext
    for i in range(10):
        eng.check(ids[i], b.block_hashes[i])
    eng.release(ids)
    return eng


def test_store_then_load_flash_attention_layout():
    _store_then_load(kv_first=True)


def test_store_then_load_blocks_first_layout():
    _store_then_load(kv_first=False)


@pytest.mark.gpu
def test_store_then_load_cuda_caches_through_the_cuda_stream():
    if not torch.cuda.is_available():
        return "no CUDA device (the handlers' stream and event path runs on a GPU machine)"
    eng = _store_then_load(kv_first=True, device="cuda")
    assert eng.worker_spec._transfers.stream is not None


def test_load_after_an_unaligned_gpu_prefix_skips_the_cached_part():
    eng = Engine(_fresh())
    prompt = list(range(2000, 2040))
    _, ids = eng.run(_request("a", prompt))
    eng.release(ids)
    b = _request("b", prompt + list(range(8)))
    ext, ids = eng.run(b, gpu_prefix_blocks=1)              # vLLM holds the first 4 tokens itself
    assert ext == 36, ext
    for i in range(10):
        eng.check(ids[i], b.block_hashes[i])


def test_eviction_keeps_everything_the_scheduler_lists_loadable():
    # Room for 6 offloaded blocks in the manager and exactly 6 in the store: every listed block is pinned.
    eng = Engine(_fresh(), num_blocks=6, num_gpu_blocks=64)
    prompts = [list(range(k * 100, k * 100 + 16)) for k in range(6)]   # 2 offloaded blocks each
    for k, p in enumerate(prompts):
        _, ids = eng.run(_request(f"r{k}", p))
        eng.release(ids)
    store = eng.worker_spec._transfers.store
    assert store.stats()["blocks"] == 6 and store.stats()["pinned"] == 6
    events = list(eng.sched.manager.take_events())
    assert sum(len(e.block_hashes) for e in events if e.removed) == 6
    assert all(e.medium == adapter.MEDIUM for e in events)
    # The last three prompts are offloaded and load; the first three were evicted and are recomputed (and
    # offloaded again, evicting the least recently used).
    for k in (3, 4, 5, 0, 1, 2):
        r = _request(f"again{k}", prompts[k] + [1, 2, 3, 4])
        ext, ids = eng.run(r)
        assert ext == (16 if k >= 3 else 0), (k, ext)
        for i in range(ext // GPU_BLOCK):
            eng.check(ids[i], r.block_hashes[i])
        eng.release(ids)
    assert store.stats()["blocks"] == 6 and store.stats()["pinned"] == 6
    assert [eng.sched.manager.lookup(_block_hashes(p)[1::2]) for p in prompts] == [2, 2, 2, 0, 0, 0]


def test_a_failed_store_or_load_is_reported_as_a_failed_job():
    eng = Engine(_fresh())
    prompt = list(range(3000, 3016))
    hashes = _block_hashes(prompt)
    kv_faults.faults["put_fail"].add(adapter._block_key(hashes[3]))
    try:
        eng.run(_request("a", prompt))
    except AssertionError as e:
        assert "failed" in str(e)
    else:
        raise AssertionError("a failed put was reported as done")
    tmp = _fresh()
    eng = Engine(tmp)
    _, ids = eng.run(_request("a", prompt))
    eng.release(ids)
    store = eng.worker_spec._transfers.store
    assert kv_faults.damage_block(tmp, adapter._block_key(hashes[1]), store.block_bytes) == 1  # its checksum fails
    try:
        eng.run(_request("b", prompt + [1, 2, 3, 4]))
    except AssertionError as e:
        assert "failed" in str(e)
    else:
        raise AssertionError("a missing block was reported as loaded")


def test_wait_blocks_until_the_jobs_are_finished():
    eng = Engine(_fresh())
    store_h = next(h for h in eng.worker.worker.handlers if h._store)
    load_h = next(h for h in eng.worker.worker.handlers if not h._store)
    prompt = list(range(4000, 4016))
    hashes = _block_hashes(prompt)
    out = eng.sched.manager.prepare_store([hashes[1], hashes[3]])
    for i in range(4):
        eng.compute(i, hashes[i])
    kv_faults.faults["delay_s"] = 0.2
    assert store_h.transfer_async(7, (GPULoadStoreSpec([0, 1, 2, 3]), out.store_spec))
    store_h.wait({7})
    assert store_h.get_finished() == [(7, True)]
    eng.sched.manager.complete_store([hashes[1], hashes[3]])
    spec = eng.sched.manager.prepare_load([hashes[1], hashes[3]])
    assert load_h.transfer_async(8, (spec, GPULoadStoreSpec([10, 11, 12, 13])))
    load_h.wait({8})
    assert load_h.get_finished() == [(8, True)]
    for i in range(4):
        eng.check(10 + i, hashes[i])
    assert load_h.get_finished() == [] and store_h.get_finished() == []


def test_layouts_and_capacities_are_checked():
    tmp = _fresh()
    spec = create_spec(_config(tmp, num_gpu_blocks=None))
    try:
        list(spec.get_handlers(_caches(48)))
    except ValueError as e:
        assert "block dimension" in str(e)
    else:
        raise AssertionError("an unknown layout was accepted")

    class Backend:  # an attention backend's cache shape tells the block dimension
        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
            return (2, num_blocks, block_size, num_kv_heads, head_size)

    caches = _caches(48)
    assert len(list(spec.get_handlers(caches, {n: Backend for n in caches}))) == 2
    spec._transfers.close()
    too_small = create_spec(_config(_fresh(), num_blocks=10, capacity_bytes=9 * _block_bytes(8)))
    try:
        list(too_small.get_handlers(_caches(48)))
    except ValueError as e:
        assert "exceeds the capacity" in str(e)
    else:
        raise AssertionError("num_blocks larger than the capacity was accepted")
    for bad in [{"num_blocks": None}, {"num_blocks": 0}, {"block_size": 6}]:
        cfg = _config(_fresh())
        cfg.kv_transfer_config.kv_connector_extra_config.update(bad)
        cfg.kv_transfer_config.kv_connector_extra_config = {
            k: v for k, v in cfg.kv_transfer_config.kv_connector_extra_config.items() if v is not None}
        try:
            create_spec(cfg)
        except (ValueError, AssertionError):
            pass
        else:
            raise AssertionError(f"{bad} accepted")


def test_manager_never_evicts_blocks_in_use():
    m = adapter.GdskitOffloadingManager(num_blocks=3, block_size=8)
    out = m.prepare_store([b"a", b"b", b"c"])
    assert out.block_hashes_to_store == [b"a", b"b", b"c"] and out.block_hashes_evicted == []
    assert m.lookup([b"a"]) == 0                           # not loadable before complete_store
    m.complete_store([b"a", b"b", b"c"])
    assert m.lookup([b"a", b"b", b"c", b"d"]) == 3
    m.prepare_load([b"a"])                                 # a is being loaded
    assert m.prepare_store([b"d", b"e", b"f"]) is None     # only b and c could go
    out = m.prepare_store([b"d", b"e"])
    assert sorted(out.block_hashes_evicted) == [b"b", b"c"]
    assert out.store_spec.evicted_keys == [adapter._block_key(h) for h in out.block_hashes_evicted]
    m.complete_load([b"a"])
    m.complete_store([b"d"], success=False)                # a failed store is forgotten
    assert m.lookup([b"a", b"d"]) == 1 and m.lookup([b"e"]) == 0
    m.touch([b"a"])
    assert m.prepare_store([b"a"]).block_hashes_to_store == []


def test_transfer_results_follow_the_installed_vllm():
    @dataclasses.dataclass
    class TransferResult:  # later releases: a dataclass instead of (job_id, success)
        job_id: int
        success: bool
        transfer_size: int = None
        transfer_time: float = None
        transfer_type: tuple = None

    saved = adapter._TransferResult
    adapter._TransferResult = TransferResult
    try:
        r = adapter._transfer_result(3, True, 4096, 0.5, ("GPU", adapter.MEDIUM))
        assert r == TransferResult(3, True, 4096, 0.5, ("GPU", adapter.MEDIUM))
    finally:
        adapter._TransferResult = saved
    assert adapter._transfer_result(3, True, 4096, 0.5, None) == (3, True)


def test_imports_without_vllm():
    code = ("import sys; import gdskit.kv.adapters.vllm as m; "
            "assert m.GdskitOffloadingSpec.__mro__[1].__module__ == m.__name__; assert 'vllm' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
