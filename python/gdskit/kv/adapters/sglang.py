"""SGLang HiCache storage (its third tier) on a gdskit block store, as a `dynamic` storage backend.

    python -m sglang.launch_server ... --enable-hierarchical-cache --hicache-mem-layout page_first \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "gdskit",
            "module_path": "gdskit.kv.adapters.sglang", "class_name": "GdskitHiCacheStorage",
            "interface_v1": 1, "path": "/nvme/hicache", "capacity_gb": 400}'

Only the zero-copy interface is served (batch_get_v1, batch_set_v1, batch_exists): "interface_v1": 1 is
required. Each page of the host pool is as many store blocks as the pool has memory segments per page (K and V
for page_first, K and V per layer for layer_first, one for MLA), read and written in place in the host pool;
block_bytes is the segment size, found from the pool. A page is a hit only when all its blocks are.

Every rank (tp, pp, cp, dp) writes its own store in its own subfolder of each folder. MLA models with more than
one TP rank are not supported: SGLang lets only rank 0 write them, while every rank reads.

Extra config fields: path (a folder or a list of folders, striped), capacity_bytes or capacity_gb (per rank),
namespace (added to the model name, page layout, dtype and rank that always are part of it), durability
("cache" or "persist"), deadline_s.
"""

from __future__ import annotations

import logging

from ._common import (capacity_from, config_value, host_array, open_store, outcome_mask, rank_folder,
                      store_key)
from ._engine import engine_attr

__all__ = ["GdskitHiCacheStorage"]

_log = logging.getLogger(__name__)

_HiCacheStorage = engine_attr("sglang.srt.mem_cache.hicache_storage", "HiCacheStorage", object)

_WHERE = "SGLang --hicache-storage-backend-extra-config"
_V1_ONLY = ("the gdskit HiCache backend serves the zero-copy interface only: set \"interface_v1\": 1 in "
            "--hicache-storage-backend-extra-config")


class GdskitHiCacheStorage(_HiCacheStorage):
    """A HiCacheStorage over gdskit.kv.BlockStore. SGLang's storage factory constructs it as
    cls(storage_config, kwargs) and then calls register_mem_pool_host(host_pool), which opens the store."""

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if not config_value(extra, "interface_v1", bool, False, where=_WHERE):
            raise ValueError(_V1_ONLY)
        self._paths = config_value(extra, "path", list, required=True, where=_WHERE)
        self._capacity = capacity_from(extra, _WHERE)
        self._durability = config_value(extra, "durability", str, "cache", where=_WHERE)
        self._deadline_s = config_value(extra, "deadline_s", float, 2.0, where=_WHERE)
        self._user_namespace = config_value(extra, "namespace", str, "", where=_WHERE)
        c = storage_config
        if getattr(c, "is_mla_model", False) and getattr(c, "tp_size", 1) > 1:
            raise ValueError("the gdskit HiCache backend does not serve MLA models with tp_size > 1 (SGLang "
                             "writes their pages from rank 0 only, and every rank reads)")
        self._rank = (f"tp{c.tp_rank}of{c.tp_size}-pp{c.pp_rank}of{c.pp_size}"
                      f"-cp{getattr(c, 'attn_cp_rank', 0)}of{getattr(c, 'attn_cp_size', 1)}"
                      f"-dp{getattr(c, 'dp_rank', 0)}of{getattr(c, 'dp_size', 1)}")
        self._model = getattr(c, "model_name", None) or ""
        self._store = None
        self._segments = 0
        self._block_bytes = 0
        self.mem_pool_host = None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        """Learns the host pool's page segments and opens this rank's store for them."""
        import torch  # noqa: PLC0415 -- SGLang always has it; the pool takes token indices as a tensor

        page_size = int(mem_pool_host.page_size)
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(page_size, dtype=torch.int64))
        if not ptrs or len(ptrs) != len(sizes) or len(set(sizes)) != 1 or sizes[0] <= 0:
            raise ValueError(f"the host pool describes a page as {len(ptrs)} segments of sizes {sorted(set(sizes))}:"
                             " the gdskit HiCache backend needs segments of one size")
        if self._store is not None:
            self.close()
        self.mem_pool_host = mem_pool_host
        self._page_size = page_size
        self._segments = len(ptrs)
        self._block_bytes = int(sizes[0])
        namespace = "|".join(["sglang", self._model, str(getattr(mem_pool_host, "layout", "")),
                              str(getattr(mem_pool_host, "dtype", "")), f"page{page_size}",
                              f"segments{self._segments}", self._rank, self._user_namespace])
        self._store = open_store(rank_folder(self._paths, self._rank), capacity_bytes=self._capacity,
                                 block_bytes=self._block_bytes, namespace=namespace,
                                 durability=self._durability, deadline_s=self._deadline_s)

    def close(self):
        """Closes the store (SGLang calls it when the backend is detached)."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    # -- the zero-copy interface ----------------------------------------------------------------------------

    def batch_exists(self, keys, extra_info=None) -> int:
        """How many leading pages of `keys` are stored (in memory, no I/O)."""
        if not keys:
            return 0
        return self._open().prefix(self._block_keys(keys)) // self._segments

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> list:
        """Reads the pages of `keys` into the host pool at `host_indices` (page_size token slots per key); per
        page, whether it was read. A page not read leaves undefined bytes in its slots."""
        blocks = self._host_blocks(keys, host_indices, "batch_get_v1")
        if blocks is None:
            return [False] * len(keys)
        skeys = self._block_keys(keys)
        try:
            mask = outcome_mask(self._open().get(skeys, blocks), len(skeys), "batch_get_v1")
        except OSError as e:
            _log.warning("HiCache get of %d pages failed: %s", len(keys), e)
            return [False] * len(keys)
        return self._per_page(mask)

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> list:
        """Writes the pages at `host_indices` under `keys` (pages already stored are not rewritten); per page,
        whether it is stored."""
        blocks = self._host_blocks(keys, host_indices, "batch_set_v1")
        if blocks is None:
            return [False] * len(keys)
        store = self._open()
        skeys = self._block_keys(keys)
        done = self._per_page(outcome_mask(store.lookup(skeys), len(skeys), "batch_set_v1"))
        todo = [i for i, d in enumerate(done) if not d]
        if todo:
            s = self._segments
            idx = [i * s + j for i in todo for j in range(s)]
            try:
                put = outcome_mask(store.put([skeys[k] for k in idx], [blocks[k] for k in idx]), len(idx),
                                   "batch_set_v1")
            except OSError as e:
                _log.warning("HiCache set of %d pages failed: %s", len(todo), e)
                put = [False] * len(idx)
            for n, i in enumerate(todo):
                done[i] = all(put[n * s:(n + 1) * s])
        return done

    def exists(self, key) -> bool:
        return self.batch_exists([key]) == 1

    # The flat-page interface copies every page through a staging tensor; it is not served.
    def get(self, key, target_location=None, target_sizes=None):
        raise NotImplementedError(_V1_ONLY)

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        raise NotImplementedError(_V1_ONLY)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        raise NotImplementedError(_V1_ONLY)

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        raise NotImplementedError(_V1_ONLY)

    def clear(self):
        _log.warning("the gdskit HiCache backend is not cleared: stored pages age out under its capacity")
        return False

    def get_stats(self):
        return None

    # -- internals ------------------------------------------------------------------------------------------

    def _open(self):
        if self._store is None:
            raise RuntimeError("the gdskit HiCache backend has no host pool yet (register_mem_pool_host)")
        return self._store

    def _block_keys(self, keys) -> list:
        out = []
        for k in keys:
            if not isinstance(k, str):
                raise TypeError(f"a HiCache key must be a string, not {type(k).__name__}")
            out.extend(store_key("sglang-page", k, j) for j in range(self._segments))
        return out

    def _per_page(self, mask) -> list:
        s = self._segments
        return [all(mask[i * s:(i + 1) * s]) for i in range(len(mask) // s)]

    def _host_blocks(self, keys, host_indices, what):
        """The host-pool memory of each block of `keys`, or None (logged) when the indices do not fit."""
        self._open()
        n = len(keys)
        if n == 0:
            return []
        count = int(host_indices.numel()) if hasattr(host_indices, "numel") else len(host_indices)
        if count != n * self._page_size:
            _log.error("%s: %d host slots for %d pages of %d tokens", what, count, n, self._page_size)
            return None
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != n * self._segments or any(int(b) != self._block_bytes for b in sizes):
            _log.error("%s: the host pool gave %d segments for %d pages (expected %d of %d bytes)", what,
                       len(ptrs), n, n * self._segments, self._block_bytes)
            return None
        return [host_array(int(p), self._block_bytes) for p in ptrs]
