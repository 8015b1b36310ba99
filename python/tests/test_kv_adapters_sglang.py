#!/usr/bin/env python3
"""The SGLang adapter (gdskit.kv.adapters.sglang) driven the way SGLang's HiCache controller drives a `dynamic`
storage backend with the zero-copy interface.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_kv_adapters_sglang.py

SGLang is not installed here. The engine side below is a TEST STAND-IN written for these tests: the module
sglang.srt.mem_cache.hicache_storage with HiCacheStorage and HiCacheStorageConfig (installed in sys.modules
before the adapter is imported, so the adapter subclasses it as it would SGLang's), the storage factory's
dynamic path (issubclass check, cls(storage_config, kwargs), register_mem_pool_host), host KV pools with
get_page_buffer_meta for the page_first, layer_first and MLA layouts, and the controller's order: backup
(batch_set_v1 in batches of 128 pages), then prefetch (batch_exists in batches of 128, stopping at the first
short batch, then batch_get_v1 in batches of 128 into other host slots, counting leading hits).
The store is the real gdskit.kv.BlockStore on temporary folders, with the faults of kv_faults.py.
"""
import dataclasses
import importlib
import os
import subprocess
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# ---- TEST STAND-IN of SGLang's storage interface (installed before the adapter is imported) -------------------

class HiCacheStorage:
    """Stand-in of SGLang's abstract storage base: the abstract methods and register_mem_pool_host."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError()

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError()

    def batch_exists(self, keys, extra_info=None):
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)


for _name in ("get", "batch_get", "set", "batch_set", "exists"):
    setattr(HiCacheStorage, _name, None)  # abstract in SGLang: the backend must define them


@dataclasses.dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: str
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: int = None
    should_split_heads: bool = False
    extra_config: dict = None


_mod = types.ModuleType("sglang.srt.mem_cache.hicache_storage")
_mod.HiCacheStorage = HiCacheStorage
_mod.HiCacheStorageConfig = HiCacheStorageConfig
for _pkg in ("sglang", "sglang.srt", "sglang.srt.mem_cache"):
    sys.modules.setdefault(_pkg, types.ModuleType(_pkg))
sys.modules["sglang.srt.mem_cache.hicache_storage"] = _mod

try:
    import torch
    from gdskit.kv.adapters import _common
    from gdskit.kv.adapters import sglang as adapter
except ImportError as e:  # pragma: no cover
    pytest.skip(f"SKIP: cannot import gdskit or torch ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH", allow_module_level=True)
import kv_faults  # noqa: E402

_common.store_class = kv_faults.Faulty
BATCH = 128  # SGLang's STORAGE_BATCH_SIZE


class HostPool:
    """Stand-in of SGLang's host KV pool: one pinned-memory-like buffer, pages of page_size token slots,
    segment pointers per page as its get_page_buffer_meta gives them."""

    def __init__(self, layout, pages, page_size=4, layers=3, heads=2, dim=8, dtype=torch.bfloat16, mla=False):
        self.layout, self.page_size, self.layer_num = layout, page_size, layers
        self.head_num, self.head_dim, self.dtype, self.mla = heads, dim, dtype, mla
        self.size = pages * page_size
        if mla:
            self.kv_buffer = torch.zeros((self.size, layers, 1, dim), dtype=dtype)
        elif layout == "page_first":
            self.kv_buffer = torch.zeros((2, self.size, layers, heads, dim), dtype=dtype)
        else:  # layer_first
            self.kv_buffer = torch.zeros((2, layers, self.size, heads, dim), dtype=dtype)

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        item = self.dtype.itemsize if hasattr(self.dtype, "itemsize") else torch.finfo(self.dtype).bits // 8
        base = self.kv_buffer.data_ptr()
        ptrs = []
        if self.mla:
            token = self.layer_num * self.head_dim * item
            for i in range(0, len(idx), self.page_size):
                ptrs.append(base + idx[i] * token)
            return ptrs, [token * self.page_size] * len(ptrs)
        if self.layout == "page_first":
            token = self.layer_num * self.head_num * self.head_dim * item
            v_off = self.size * token
            for i in range(0, len(idx), self.page_size):
                ptrs += [base + idx[i] * token, base + idx[i] * token + v_off]
            return ptrs, [token * self.page_size] * len(ptrs)
        token = self.head_num * self.head_dim * item
        layer = self.size * token
        v_off = self.layer_num * layer
        for i in range(0, len(idx), self.page_size):
            for lyr in range(self.layer_num):
                k = base + lyr * layer + idx[i] * token
                ptrs += [k, k + v_off]
        return ptrs, [token * self.page_size] * len(ptrs)

    def slots(self, pages):
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size) for p in pages]
                         + [torch.empty(0, dtype=torch.int64)])

    def page(self, p):
        s = slice(p * self.page_size, (p + 1) * self.page_size)
        if self.mla:
            return self.kv_buffer[s].clone()
        if self.layout == "page_first":
            return self.kv_buffer[:, s].clone()
        return self.kv_buffer[:, :, s].clone()


def create_backend(extra, tp_rank=0, tp_size=1, mla=False, model="org/model"):
    """SGLang's storage factory on its dynamic path."""
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    if not issubclass(cls, HiCacheStorage):
        raise TypeError("must inherit from HiCacheStorage")
    config = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                  attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                  is_page_first_layout=True, model_name=model, extra_config=dict(extra))
    return cls(config, {})


def backup(backend, hashes, host_indices, page_size):
    """The controller's _page_backup: batches of 128 pages, all(batch_set_v1(...)), stop at the first failure.
    Returns the tokens written."""
    done = 0
    for i in range(0, len(hashes), BATCH):
        batch = hashes[i:i + BATCH]
        if not all(backend.batch_set_v1(batch, host_indices[i * page_size:(i + len(batch)) * page_size])):
            break
        done += len(batch) * page_size
    return done


def prefetch(backend, hashes, host_indices, page_size):
    """The controller's hit query then page transfer: batch_exists per 128 pages up to the first short batch,
    then batch_get_v1 per 128 pages, counting leading successes. Returns (hit pages, loaded pages)."""
    hit = []
    for i in range(0, len(hashes), BATCH):
        batch = hashes[i:i + BATCH]
        n = backend.batch_exists(batch, None)
        hit += batch[:n]
        if n < len(batch):
            break
    loaded = 0
    for i in range(0, len(hit), BATCH):
        batch = hit[i:i + BATCH]
        results = backend.batch_get_v1(batch, host_indices[i * page_size:(i + len(batch)) * page_size], None)
        n = next((j for j, r in enumerate(results) if not r), len(results))
        loaded += n
        if n < len(batch):
            break
    return len(hit), loaded


def _extra(tmp, **more):
    e = {"backend_name": "gdskit", "module_path": "gdskit.kv.adapters.sglang",
         "class_name": "GdskitHiCacheStorage", "interface_v1": 1, "path": tmp, "capacity_bytes": 64 << 20}
    e.update(more)
    return e


def _fresh():
    kv_faults.reset()
    return kv_faults.fresh_folder("kv-sglang-")


def _attached(pages, layout="page_first"):
    """A backend made by the factory on a fresh folder, with a host pool of `pages` pages registered."""
    backend = create_backend(_extra(_fresh()))
    pool = HostPool(layout, pages=pages)
    backend.register_mem_pool_host(pool)
    return backend, pool


def _round_trip(layout, mla=False, pages=300):
    tmp = _fresh()
    torch.manual_seed(1)
    backend = create_backend(_extra(tmp), mla=mla)
    pool = HostPool(layout, pages=2 * pages + 8, mla=mla)
    backend.register_mem_pool_host(pool)
    pool.kv_buffer.copy_(torch.randn_like(pool.kv_buffer.float()).to(pool.dtype))
    hashes = [f"{i:064x}" for i in range(pages)]
    src_pages = list(range(pages))
    assert backup(backend, hashes, pool.slots(src_pages), pool.page_size) == pages * pool.page_size
    expect = [pool.page(p) for p in src_pages]
    dst_pages = list(range(pages, 2 * pages))
    assert prefetch(backend, hashes, pool.slots(dst_pages), pool.page_size) == (pages, pages)
    for p, e in zip(dst_pages, expect):
        assert torch.equal(pool.page(p).view(torch.int16), e.view(torch.int16)), f"page {p} differs"
    backend.close()
    return backend


# ---- tests ----------------------------------------------------------------------------------------------------

def test_round_trip_page_first():
    b = _round_trip("page_first")
    assert b._segments == 2


def test_round_trip_layer_first():
    b = _round_trip("layer_first")
    assert b._segments == 6  # K and V of 3 layers per page


def test_round_trip_mla():
    b = _round_trip("page_first", mla=True, pages=40)
    assert b._segments == 1


def test_prefix_stops_at_the_first_missing_page():
    backend, pool = _attached(700)
    hashes = [f"h{i}" for i in range(300)]
    assert backup(backend, hashes[:200], pool.slots(range(200)), pool.page_size) == 200 * pool.page_size
    assert prefetch(backend, hashes, pool.slots(range(300, 600)), pool.page_size) == (200, 200)
    # A page with only its K block stored is no hit.
    key = _common.store_key("sglang-page", hashes[150], 1)
    assert kv_faults.damage_block(backend._paths[0], key, backend._block_bytes) == 1  # its checksum fails
    assert prefetch(backend, hashes, pool.slots(range(300, 600)), pool.page_size) == (200, 150)
    backend.close()


def test_set_skips_stored_pages_and_reports_failed_ones():
    backend, pool = _attached(64)
    hashes = [f"p{i}" for i in range(10)]
    assert all(backend.batch_set_v1(hashes[:6], pool.slots(range(6))))
    store = backend._store
    before = store.stats()["stored"]
    kv_faults.faults["put_fail"].add(_common.store_key("sglang-page", hashes[8], 0))
    assert backend.batch_set_v1(hashes, pool.slots(range(10))) == [True] * 8 + [False, True]
    assert store.stats()["stored"] - before == 2 * 3 + 1  # pages 6, 7, 9 and the V block of page 8
    assert backend.batch_exists(hashes) == 8
    assert backup(backend, hashes, pool.slots(range(10)), pool.page_size) == 0  # the one batch failed
    backend.close()


def test_mismatched_host_slots_fail_the_batch_not_the_thread():
    backend, pool = _attached(16)
    assert backend.batch_set_v1(["a", "b"], pool.slots([0])[:-1]) == [False, False]
    assert backend.batch_get_v1(["a", "b"], pool.slots([0])) == [False, False]
    assert backend.batch_get_v1([], pool.slots([])) == []
    assert backend.batch_exists([]) == 0
    backend.close()


def test_configuration_is_checked():
    tmp = _fresh()
    for bad in [{"interface_v1": 0}, {"path": None}, {"capacity_bytes": None},
                {"capacity_bytes": 1, "capacity_gb": 1}, {"deadline_s": "x"}, {"durability": 3}]:
        extra = _extra(tmp)
        extra.update(bad)
        extra = {k: v for k, v in extra.items() if v is not None}
        try:
            create_backend(extra)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{bad} accepted")
    try:
        create_backend(_extra(tmp), tp_size=2, mla=True)
    except ValueError as e:
        assert "MLA" in str(e)
    else:
        raise AssertionError("MLA with tp_size 2 accepted")
    backend = create_backend(_extra(tmp))
    try:
        backend.batch_exists(["a"])
    except RuntimeError:
        pass
    else:
        raise AssertionError("used before register_mem_pool_host")
    for legacy in (lambda: backend.get("a"), lambda: backend.batch_set(["a"], [])):
        try:
            legacy()
        except NotImplementedError as e:
            assert "interface_v1" in str(e)
        else:
            raise AssertionError("the flat-page interface answered")


def test_ranks_have_their_own_stores_and_reattach_finds_pages():
    tmp = _fresh()
    pools, backends = [], []
    for rank in range(2):
        b = create_backend(_extra(tmp), tp_rank=rank, tp_size=2)
        p = HostPool("page_first", pages=32)
        p.kv_buffer.fill_(rank + 1)
        b.register_mem_pool_host(p)
        assert all(b.batch_set_v1(["shared"], p.slots([0])))
        pools.append(p)
        backends.append(b)
    assert sorted(os.listdir(tmp)) == ["tp0of2-pp0of1-cp0of1-dp0of1", "tp1of2-pp0of1-cp0of1-dp0of1"]
    for b in backends:
        b.close()
    # Detach and attach again (a new backend on the same folders): the pages are found and each rank reads its own.
    for rank in range(2):
        b = create_backend(_extra(tmp), tp_rank=rank, tp_size=2)
        p = HostPool("page_first", pages=32)
        b.register_mem_pool_host(p)
        assert b.batch_exists(["shared"]) == 1
        assert b.batch_get_v1(["shared"], p.slots([5])) == [True]
        assert torch.all(p.page(5) == rank + 1)
        b.close()
    # Another model or layout never sees them.
    b = create_backend(_extra(tmp), model="org/other")
    b.register_mem_pool_host(HostPool("page_first", pages=32))
    assert b.batch_exists(["shared"]) == 0
    b.close()


def test_imports_without_sglang():
    env = dict(os.environ)
    code = ("import sys; import gdskit.kv.adapters.sglang as m; "
            "assert m.GdskitHiCacheStorage.__mro__[1] is object; assert 'sglang' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
