#!/usr/bin/env python3
"""The LMCache adapter (gdskit.kv.adapters.lmcache) driven the way LMCache drives a native_plugin L2 client.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_kv_adapters_lmcache.py

LMCache is not installed here. The engine side below is a TEST STAND-IN written for these tests: the
native_plugin factory's checks and LMCache's native-connector bridge (one demux thread that polls the client's
event_fd, drains completions and routes them by future id; submits registered under the bridge's lock), with
the multi-process controllers' order: store, then lookup-and-lock, load, unlock. Chunks are ctypes buffers,
as LMCache's MemoryObj.byte_array. The store is the real gdskit.kv.BlockStore on temporary folders, with the
faults of kv_faults.py.
"""
import ctypes
import importlib
import os
import random
import select
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from gdskit.kv.adapters import _common
    from gdskit.kv.adapters import lmcache as adapter
except ImportError as e:  # pragma: no cover
    pytest.skip(f"SKIP: cannot import gdskit ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH", allow_module_level=True)
import kv_faults  # noqa: E402
from gdskit.kv import capacity_for  # noqa: E402

_common.store_class = kv_faults.Faulty
CHUNK = 4096 + 512  # not a power of two on purpose
REQUIRED = ["event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists", "drain_completions", "close"]


# ---- TEST STAND-IN of LMCache's engine side ------------------------------------------------------------------

def native_plugin_factory(config: dict):
    """What LMCache's native_plugin factory does with its JSON: import, construct with adapter_params, check the
    required methods (closing the client when one is missing), note a missing submit_batch_delete."""
    cls = getattr(importlib.import_module(config["module_path"]), config["class_name"])
    client = cls(**config.get("adapter_params", {}))
    missing = [m for m in REQUIRED if not callable(getattr(client, m, None))]
    if missing:
        client.close()
        raise TypeError(f"missing {missing}")
    return Bridge(client), callable(getattr(client, "submit_batch_delete", None))


class Bridge:
    """LMCache's native-connector bridge, reduced to what touches the client: a demux thread on the client's one
    event fd, completions routed by future id to store results, lookup bitmaps (with client-side lock counts)
    and load bitmaps."""

    def __init__(self, client):
        self.client = client
        self.fd = int(client.event_fd())
        self.lock = threading.Lock()
        self.pending = {}       # future id -> (op, task id, n keys, keys)
        self.stores, self.lookups, self.loads = {}, {}, {}
        self.locked = {}
        self.unknown = []
        self.wakeups = 0        # drains that found nothing: the fd was readable with nothing to drain
        self.next_task = 0
        self.done = threading.Condition(self.lock)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._demux, daemon=True)
        self.thread.start()

    def _submit(self, op, keys, call):
        with self.lock:
            task = self.next_task
            self.next_task += 1
            fid = int(call())
            self.pending[fid] = (op, task, len(keys), list(keys))
        return task

    def store(self, keys, bufs):
        return self._submit("store", keys, lambda: self.client.submit_batch_set(keys, [memoryview(b) for b in bufs]))

    def lookup_and_lock(self, keys):
        return self._submit("lookup", keys, lambda: self.client.submit_batch_exists(keys))

    def load(self, keys, bufs):
        return self._submit("load", keys, lambda: self.client.submit_batch_get(keys, [memoryview(b) for b in bufs]))

    def unlock(self, keys):
        with self.lock:
            for k in keys:
                if self.locked.get(k, 0) <= 1:
                    self.locked.pop(k, None)
                else:
                    self.locked[k] -= 1

    def result(self, table, task, timeout=10.0):
        end = time.monotonic() + timeout
        with self.done:
            while task not in table:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"task {task} never completed")
                self.done.wait(left)
            return table.pop(task)

    def _demux(self):
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(100):
                continue
            completions = self.client.drain_completions()
            with self.done:
                if not completions:
                    self.wakeups += 1
                for fid, ok, error, bools in completions:
                    entry = self.pending.pop(int(fid), None)
                    if entry is None:
                        self.unknown.append(fid)
                        continue
                    op, task, n, keys = entry
                    if op == "store":
                        self.stores[task] = (ok, error)
                    elif op == "lookup":
                        bitmap = [bool(b) for b in bools] if ok and bools is not None else [False] * n
                        for k, hit in zip(keys, bitmap):
                            if hit:
                                self.locked[k] = self.locked.get(k, 0) + 1
                        self.lookups[task] = bitmap
                    else:
                        if bools is not None:
                            self.loads[task] = [bool(b) for b in bools]
                        else:
                            self.loads[task] = [ok] * n
                self.done.notify_all()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.client.close()


# ---- helpers --------------------------------------------------------------------------------------------------

def _chunk(rng, nbytes=CHUNK):
    buf = (ctypes.c_ubyte * nbytes)()
    ctypes.memmove(buf, rng.randbytes(nbytes), nbytes)
    return buf


def _key(i, rank=0):
    return f"llama@{rank:08x}@0@{i:064x}"


def _config(tmp, **params):
    p = {"path": tmp, "capacity_bytes": 64 * CHUNK, "block_bytes": CHUNK, "namespace": "test-model/bf16"}
    p.update(params)
    return {"type": "native_plugin", "module_path": "gdskit.kv.adapters.lmcache", "class_name": "GdskitL2Client",
            "adapter_params": p}


def _fresh():
    kv_faults.reset()
    return kv_faults.fresh_folder("kv-lmcache-")


def _readable(fd):
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


# ---- tests ----------------------------------------------------------------------------------------------------

def test_factory_accepts_the_client_and_checks_parameters():
    tmp = _fresh()
    bridge, has_delete = native_plugin_factory(_config(tmp))
    try:
        assert not has_delete  # LMCache then logs that its eviction delete is a no-op (the store evicts itself)
    finally:
        bridge.close()
    for bad, exc in [({"block_bytes": None}, ValueError), ({"block_bytes": 0}, ValueError),
                     ({"capacity_gb": 1}, ValueError), ({"path": []}, ValueError),
                     ({"deadline_s": "soon"}, ValueError), ({"nonsense": 1}, TypeError)]:
        cfg = _config(tmp)
        cfg["adapter_params"].update(bad)
        try:
            native_plugin_factory(cfg)
        except exc:
            pass
        else:
            raise AssertionError(f"{bad} accepted")


def test_store_lookup_load_unlock_round_trip():
    tmp = _fresh()
    rng = random.Random(1)
    bridge, _ = native_plugin_factory(_config(tmp))
    try:
        chunks = {_key(i): _chunk(rng) for i in range(20)}
        keys = list(chunks)
        t1 = bridge.store(keys[:12], [chunks[k] for k in keys[:12]])
        t2 = bridge.store(keys[12:], [chunks[k] for k in keys[12:]])
        assert bridge.result(bridge.stores, t1) == (True, "")
        assert bridge.result(bridge.stores, t2) == (True, "")
        asked = keys[:5] + [_key(100), _key(101)] + keys[5:15] + [_key(0, rank=1)]
        hits = bridge.result(bridge.lookups, bridge.lookup_and_lock(asked))
        assert hits == [k in chunks for k in asked], hits
        assert all(bridge.locked.get(k) == 1 for k in asked if k in chunks)
        sentinel = 0xAB
        bufs = []
        for _ in asked:
            b = (ctypes.c_ubyte * CHUNK)()
            ctypes.memset(b, sentinel, CHUNK)
            bufs.append(b)
        got = bridge.result(bridge.loads, bridge.load(asked, bufs))
        assert got == hits
        for k, b in zip(asked, bufs):
            if k in chunks:
                assert bytes(b) == bytes(chunks[k]), k
            else:
                assert bytes(b) == bytes([sentinel]) * CHUNK, "a missed chunk's buffer was written"
        bridge.unlock(asked)
        assert not bridge.locked
        assert not bridge.unknown
    finally:
        bridge.close()


def test_event_fd_is_readable_only_while_completions_wait():
    tmp = _fresh()
    client = adapter.GdskitL2Client(**_config(tmp)["adapter_params"])
    try:
        fd = client.event_fd()
        assert not _readable(fd)
        fid = client.submit_batch_exists([_key(1), _key(2)])
        assert _readable(fd)
        assert client.drain_completions() == [(fid, True, "", [False, False])]
        assert not _readable(fd)
        rng = random.Random(2)
        bufs = [_chunk(rng) for _ in range(3)]
        fid = client.submit_batch_set([_key(i) for i in range(3)], [memoryview(b) for b in bufs])
        end = time.monotonic() + 10
        while not _readable(fd):
            assert time.monotonic() < end, "set never completed"
            time.sleep(0.001)
        assert client.drain_completions() == [(fid, True, "", None)]
        assert not _readable(fd)
        assert client.drain_completions() == []
    finally:
        client.close()


def test_demux_thread_never_spins():
    tmp = _fresh()
    rng = random.Random(3)
    bridge, _ = native_plugin_factory(_config(tmp))
    try:
        for round_ in range(5):
            keys = [_key(round_ * 10 + i) for i in range(4)]
            t = bridge.store(keys, [_chunk(rng) for _ in keys])
            assert bridge.result(bridge.stores, t)[0]
            bridge.result(bridge.lookups, bridge.lookup_and_lock(keys))
        time.sleep(0.3)
        # Each wake-up found a completion: the descriptor does not stay readable once drained.
        assert bridge.wakeups <= 1, bridge.wakeups
    finally:
        bridge.close()


def test_chunks_of_another_size_fail_alone():
    tmp = _fresh()
    rng = random.Random(4)
    bridge, _ = native_plugin_factory(_config(tmp))
    try:
        keys = [_key(i) for i in range(3)]
        bufs = [_chunk(rng), _chunk(rng, CHUNK - 1), _chunk(rng)]
        ok, error = bridge.result(bridge.stores, bridge.store(keys, bufs))
        assert not ok and "block_bytes" in error, error
        assert bridge.result(bridge.lookups, bridge.lookup_and_lock(keys)) == [True, False, True]
        outs = [(ctypes.c_ubyte * CHUNK)(), (ctypes.c_ubyte * (CHUNK + 8))(), (ctypes.c_ubyte * CHUNK)()]
        assert bridge.result(bridge.loads, bridge.load(keys, outs)) == [True, False, True]
        assert bytes(outs[0]) == bytes(bufs[0]) and bytes(outs[2]) == bytes(bufs[2])
    finally:
        bridge.close()


def test_set_does_not_rewrite_stored_chunks():
    tmp = _fresh()
    rng = random.Random(5)
    bridge, _ = native_plugin_factory(_config(tmp))
    try:
        keys = [_key(i) for i in range(6)]
        bufs = [_chunk(rng) for _ in keys]
        assert bridge.result(bridge.stores, bridge.store(keys[:4], bufs[:4]))[0]
        store = bridge.client._store
        before = store.stats()["stored"]
        assert bridge.result(bridge.stores, bridge.store(keys, bufs))[0]
        assert store.stats()["stored"] - before == 2
    finally:
        bridge.close()


def test_failed_puts_are_reported_and_the_rest_is_served():
    tmp = _fresh()
    rng = random.Random(6)
    bridge, _ = native_plugin_factory(_config(tmp))
    try:
        keys = [_key(i) for i in range(4)]
        kv_faults.faults["put_fail"].add(_common.store_key(keys[2]))
        bufs = [_chunk(rng) for _ in keys]
        ok, error = bridge.result(bridge.stores, bridge.store(keys, bufs))
        assert not ok and "1 of 4" in error, error
        outs = [(ctypes.c_ubyte * CHUNK)() for _ in keys]
        assert bridge.result(bridge.loads, bridge.load(keys, outs)) == [True, True, False, True]
        assert kv_faults.damage_block(tmp, _common.store_key(keys[0]), CHUNK) == 1  # its checksum fails
        assert bridge.result(bridge.loads, bridge.load(keys, outs)) == [False, True, False, True]
    finally:
        bridge.close()


def test_capacity_eviction_shows_as_misses_never_wrong_bytes():
    tmp = _fresh()
    rng = random.Random(7)
    bridge, _ = native_plugin_factory(_config(tmp, capacity_bytes=capacity_for(8, CHUNK)))
    try:
        chunks = {_key(i): _chunk(rng) for i in range(20)}
        for i in range(0, 20, 5):
            ks = list(chunks)[i:i + 5]
            assert bridge.result(bridge.stores, bridge.store(ks, [chunks[k] for k in ks]))[0]
        keys = list(chunks)
        outs = [(ctypes.c_ubyte * CHUNK)() for _ in keys]
        got = bridge.result(bridge.loads, bridge.load(keys, outs))
        assert sum(got) == 8 and got[-8:] == [True] * 8, got
        for k, b, hit in zip(keys, outs, got):
            if hit:
                assert bytes(b) == bytes(chunks[k])
    finally:
        bridge.close()


def test_concurrent_submitters_each_completion_once():
    tmp = _fresh()
    bridge, _ = native_plugin_factory(_config(tmp, capacity_bytes=1024 * CHUNK))
    errors = []

    def worker(w):
        try:
            rng = random.Random(100 + w)
            for r in range(10):
                keys = [_key(w * 1000 + r * 10 + i) for i in range(3)]
                bufs = [_chunk(rng) for _ in keys]
                assert bridge.result(bridge.stores, bridge.store(keys, bufs))[0]
                outs = [(ctypes.c_ubyte * CHUNK)() for _ in keys]
                assert bridge.result(bridge.loads, bridge.load(keys, outs)) == [True] * 3
                assert all(bytes(o) == bytes(b) for o, b in zip(outs, bufs))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert not bridge.pending and not bridge.unknown
    finally:
        bridge.close()


def test_close_cancels_what_is_in_flight():
    tmp = _fresh()
    rng = random.Random(8)
    client = adapter.GdskitL2Client(**_config(tmp)["adapter_params"])
    bufs = [_chunk(rng) for _ in range(3)]
    fid = client.submit_batch_set([_key(i) for i in range(3)], [memoryview(b) for b in bufs])
    done = []
    while not any(c[0] == fid for c in done):  # the chunks are stored before the delayed get
        select.select([client.event_fd()], [], [], 10)
        done += client.drain_completions()
    assert [c[:3] for c in done] == [(fid, True, "")], done
    kv_faults.faults["delay_s"] = 30.0
    client.submit_batch_get([_key(i) for i in range(3)], [memoryview(b) for b in bufs])
    t0 = time.monotonic()
    client.close()
    assert time.monotonic() - t0 < 5, "close waited for the delayed batch instead of cancelling it"
    client.close()  # idempotent
    assert client.drain_completions() == []
    try:
        client.submit_batch_exists([_key(0)])
    except ValueError:
        pass
    else:
        raise AssertionError("a closed client accepted a submit")
    # The folder is free again: a new client opens it and finds the stored chunks.
    kv_faults.faults["delay_s"] = 0.0
    again = adapter.GdskitL2Client(**_config(tmp)["adapter_params"])
    try:
        fid = again.submit_batch_exists([_key(i) for i in range(3)])
        assert again.drain_completions() == [(fid, True, "", [True] * 3)]
    finally:
        again.close()


def test_bad_arguments_are_refused_before_any_io():
    tmp = _fresh()
    client = adapter.GdskitL2Client(**_config(tmp)["adapter_params"])
    try:
        buf = memoryview((ctypes.c_ubyte * CHUNK)())
        for call, exc in [(lambda: client.submit_batch_get([], []), ValueError),
                          (lambda: client.submit_batch_set([_key(0)], []), ValueError),
                          (lambda: client.submit_batch_get([b"raw"], [buf]), TypeError),
                          (lambda: client.submit_batch_exists("llama@0"), ValueError),
                          (lambda: client.submit_batch_get([_key(0)], [memoryview(bytes(CHUNK))]), ValueError)]:
            try:
                call()
            except exc:
                pass
            else:
                raise AssertionError("accepted")
        assert client.drain_completions() == []
    finally:
        client.close()


def test_a_second_client_on_the_same_folder_is_refused():
    tmp = _fresh()
    client = adapter.GdskitL2Client(**_config(tmp)["adapter_params"])
    try:
        adapter.GdskitL2Client(**_config(tmp)["adapter_params"])
    except OSError:
        pass
    else:
        raise AssertionError("two writers on one folder")
    finally:
        client.close()
