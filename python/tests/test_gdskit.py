#!/usr/bin/env python3
"""Tests of the gdskit Python package that run without a GPU, torch or numpy (those parts skip with the reason).

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_gdskit.py
"""
import errno
import hashlib
import json
import os
import struct
import tempfile

import pytest

import gdskit


def write_st(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} -> a safetensors file."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


TENSORS = {
    "w": ("F32", (2, 3), struct.pack("<6f", *range(6))),
    "b": ("BF16", (4,), os.urandom(8)),
    "s": ("I64", (), struct.pack("<q", -5)),
    "e": ("F16", (0, 3), b""),
    "q": ("F8_E4M3", (5,), os.urandom(5)),
}


def test_load_cpu_raw():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        write_st(p, TENSORS, {"format": "pt"})
        tensors, stats = gdskit.load_safetensors_raw(p, device="cpu")
        assert set(tensors) == set(TENSORS)
        for k, (dtype, shape, raw) in TENSORS.items():
            assert tensors[k].dtype == dtype
            assert tuple(tensors[k].shape) == shape
            assert tensors[k].tobytes() == raw, k
        assert stats["path"] == "host", stats
        assert stats["metadata"] == {"format": "pt"}
        # A DLPack capsule can be taken and dropped unconsumed (its deleter frees it).
        cap = tensors["w"].capsule()
        assert type(cap).__name__ == "PyCapsule"
        del cap
        assert tensors["w"].__dlpack_device__() == (1, 0)


def test_subset_and_slice():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        write_st(p, TENSORS)
        tensors, _ = gdskit.load_safetensors_raw(p, device="cpu", only=["w"], rank=1, world=2, split_dim=1)
        assert list(tensors) == ["w"]
        # columns 2 of 3 split in 2: rank 1 gets column 2 of each row -> floats 2 and 5
        assert tensors["w"].tobytes() == struct.pack("<2f", 2, 5)
        assert tuple(tensors["w"].shape) == (2, 1)


def test_checksums_match_hashlib():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        write_st(p, TENSORS)
        tensors, _ = gdskit.load_safetensors_raw(p)
        for k, (_, _, raw) in TENSORS.items():
            assert hashlib.sha256(tensors[k].tobytes()).hexdigest() == hashlib.sha256(raw).hexdigest()


def test_errors_keep_errno():
    with tempfile.TemporaryDirectory() as d:
        try:
            gdskit.load_safetensors_raw(os.path.join(d, "missing.safetensors"))
            raise AssertionError("no error")
        except FileNotFoundError as e:
            assert e.errno == errno.ENOENT
        bad = os.path.join(d, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", 2) + b"[]")
        try:
            gdskit.load_safetensors_raw(bad)
            raise AssertionError("no error")
        except OSError as e:
            assert e.errno == errno.EBADMSG, e
            assert "bad.safetensors" in str(e)
        try:
            gdskit.load_safetensors_raw(bad, device="tpu")
            raise AssertionError("no error")
        except ValueError as e:
            assert "tpu" in str(e)


def test_header_and_plan():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        write_st(p, TENSORS)
        entries, meta = gdskit.header(p)
        assert {e["name"] for e in entries} == set(TENSORS)
        kind, reasons = gdskit.plan(p, "cpu")
        assert kind == "host", (kind, reasons)


def test_read_into_numpy():
    try:
        import numpy as np
    except ImportError:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "raw.bin")
        data = os.urandom(10000)
        with open(p, "wb") as f:
            f.write(data)
        a = np.zeros(1000, dtype=np.uint8)
        assert gdskit.read(p, a, 123) == 1000
        assert a.tobytes() == data[123:1123]
        w = gdskit.load_safetensors(_tmp_model(d), device="cpu",
                                framework="numpy")["w"]
        assert w.tolist() == [[0, 1, 2], [3, 4, 5]]
    return None


def _tmp_model(d):
    p = os.path.join(d, "m.safetensors")
    write_st(p, TENSORS)
    return p


def test_torch_cpu():
    try:
        import torch
    except ImportError:
        return "skip: torch not installed"
    with tempfile.TemporaryDirectory() as d:
        t = gdskit.load_safetensors(_tmp_model(d), device="cpu")
        assert t["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert t["s"].item() == -5 and t["s"].dim() == 0
        assert t["b"].dtype == torch.bfloat16
    return None


def _tmp_checkpoint(d, nfiles=3):
    """A checkpoint of `nfiles` shards with an index; returns its folder and {name: (dtype, shape, bytes)}."""
    weight_map, want = {}, {}
    for f in range(nfiles):
        name = f"model-{f + 1:05d}-of-{nfiles:05d}.safetensors"
        tensors = {f"s{f}.w": ("U8", (3, 1001 + f), os.urandom(3 * (1001 + f))),
                   f"s{f}.b": ("F32", (5,), os.urandom(20))}
        write_st(os.path.join(d, name), tensors)
        for k in tensors:
            weight_map[k] = name
        want.update(tensors)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    return d, want


def test_sharded_load_allocates_once_per_shard_on_the_calling_thread():
    try:
        import numpy as np
    except ImportError:
        return "skip: numpy not installed"
    import threading
    with tempfile.TemporaryDirectory() as d:
        folder, want = _tmp_checkpoint(d)
        calls = []

        def allocate(n):
            calls.append((n, threading.get_ident()))
            return np.zeros(n, dtype=np.uint8)

        tensors, stats = gdskit.load_safetensors_raw(folder, allocate=allocate)
        assert len(calls) == 3, calls
        assert all(t == threading.get_ident() for _, t in calls), calls
        assert stats["allocations"] == 3 and stats["files"] == 3, stats
        assert 0 <= stats["overlapped_seconds"] <= stats["header_seconds"] + stats["alloc_seconds"], stats
        assert stats["first_read_seconds"] > 0, stats
        import gc
        gc.collect()  # the arrays live on in the tensors
        for k, (dtype, shape, raw) in want.items():
            assert tensors[k].tobytes() == raw, k
        # Only some shards: the others get no allocation.
        calls.clear()
        tensors, stats = gdskit.load_safetensors_raw(folder, only=["s0.", "s2.b"], allocate=allocate)
        assert len(calls) == 2 and sorted(tensors) == ["s0.b", "s0.w", "s2.b"], (calls, sorted(tensors))
        assert tensors["s2.b"].tobytes() == want["s2.b"][2]


def test_torch_sharded_checkpoint():
    try:
        import torch
    except ImportError:
        return "skip: torch not installed"
    with tempfile.TemporaryDirectory() as d:
        folder, want = _tmp_checkpoint(d)
        t = gdskit.load_safetensors(folder, device="cpu", framework="torch")
        assert gdskit.last_stats()["allocations"] == 3
        assert list(t) == [k for k in want], list(t)
        for k, (dtype, shape, raw) in want.items():
            assert tuple(t[k].shape) == shape, k
            assert t[k].contiguous().view(torch.uint8).numpy().tobytes() == raw, k
    return None


# ---- the safetensors library's API, against files and answers of the real library ----

GOLDEN = os.environ.get("GDSKIT_GOLDEN_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "safetensors", "golden")


def _manifest():
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        return json.load(f)


def _torch_or_skip():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _tensor_bytes(t):
    """The raw bytes of a torch tensor or numpy array."""
    if hasattr(t, "numpy") and hasattr(t, "element_size"):
        import torch
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return t.tobytes()


# dtypes whose torch type this torch may lack: the file's tensors of those are checked through numpy instead.
_TORCH_NAMES = {"U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E4M3": "float8_e4m3fn",
                "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2"}
_TORCH_DTYPE_OF = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "C64": "complex64",
                   "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _torch_lacks(torch, dtype):
    name = _TORCH_NAMES.get(dtype)
    return name is not None and not hasattr(torch, name)


def _index_of(spec):
    """The manifest's index notation -> a Python index."""
    out = []
    for item in spec:
        if item == "...":
            out.append(Ellipsis)
        elif isinstance(item, list):
            out.append(slice(*item))
        else:
            out.append(item)
    return tuple(out)


def test_golden_load_file():
    torch = _torch_or_skip()
    if torch is None:
        return "skip: torch not installed"
    skipped = []
    for entry in _manifest()["files"]:
        path = os.path.join(GOLDEN, entry["file"])
        lacking = [n for n, t in entry["tensors"].items() if _torch_lacks(torch, t["dtype"])]
        unsigned = [n for n in lacking if entry["tensors"][n]["dtype"] in ("U16", "U32", "U64")]
        if unsigned:
            # safetensors needs the same torch types; without them the whole load fails, and so does ours.
            try:
                gdskit.load_file(path)
                raise AssertionError(f"{entry['file']}: loaded {unsigned} without torch.uint64")
            except TypeError:
                skipped.append(entry["file"])
                continue
        loaded = gdskit.load_file(path)
        assert list(loaded) == entry["load_file_keys"], (entry["file"], list(loaded))
        for name, want in entry["tensors"].items():
            t = loaded[name]
            assert list(t.shape) == want["shape"], (name, list(t.shape), want["shape"])
            assert hashlib.sha256(_tensor_bytes(t)).hexdigest() == want["sha256"], name
            if name not in lacking and want["dtype"] in _TORCH_DTYPE_OF:
                assert t.dtype == getattr(torch, _TORCH_DTYPE_OF[want["dtype"]]), (name, t.dtype)
            assert t.device.type == "cpu"
    # Every dtype is still compared byte for byte through safe_open (test_golden_safe_open).
    return f"skip: load_file of {', '.join(skipped)} needs torch >= 2.3" if skipped else None


def _numpy_missing():
    try:
        import numpy  # noqa: F401
    except ImportError:
        return "skip: numpy not installed"
    return None


def test_golden_safe_open():
    if _numpy_missing():
        return _numpy_missing()
    torch = _torch_or_skip()
    frameworks = ["np"] + (["pt"] if torch is not None else [])
    for framework in frameworks:
        for entry in _manifest()["files"]:
            path = os.path.join(GOLDEN, entry["file"])
            with gdskit.safe_open(path, framework=framework) as f:
                assert f.keys() == entry["keys"], (entry["file"], f.keys())
                assert f.metadata() == entry["metadata"], (entry["file"], f.metadata())
                for name, want in entry["tensors"].items():
                    if framework == "pt" and _torch_lacks(torch, want["dtype"]) and want["dtype"] != "F4" \
                            and want["dtype"] not in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):
                        continue  # no such torch dtype here: checked through numpy
                    sl = f.get_slice(name)
                    assert sl.get_dtype() == want["dtype"] and sl.get_shape() == _file_shape(path, name)
                    t = f.get_tensor(name)
                    assert list(t.shape) == want["shape"], (framework, name, list(t.shape), want["shape"])
                    assert hashlib.sha256(_tensor_bytes(t)).hexdigest() == want["sha256"], (framework, name)
                for case in entry["slices"]:
                    want_dtype = entry["tensors"][case["name"]]["dtype"]
                    if framework == "pt" and _torch_lacks(torch, want_dtype):
                        continue
                    sl = f.get_slice(case["name"])
                    index = _index_of(case["index"])
                    if "error" in case:
                        try:
                            sl[index]
                            raise AssertionError(f"{case} gave no error")
                        except Exception as e:  # noqa: BLE001
                            assert type(e).__name__ == case["error"], (case, repr(e))
                        continue
                    t = sl[index]
                    assert list(t.shape) == case["shape"], (framework, case, list(t.shape))
                    assert hashlib.sha256(_tensor_bytes(t)).hexdigest() == case["sha256"], (framework, case)


def _file_shape(path, name):
    entries, _ = gdskit.header(path)
    return next(list(e["shape"]) for e in entries if e["name"] == name)


def test_safe_open_errors():
    if _numpy_missing():
        return _numpy_missing()
    with tempfile.TemporaryDirectory() as d:
        p = _tmp_model(d)
        for bad in ("tf", "flax", "jax", ""):
            try:
                gdskit.safe_open(p, framework=bad)
                raise AssertionError(bad)
            except ValueError:
                pass
        with gdskit.safe_open(p, framework="np") as f:
            try:
                f.get_tensor("nope")
                raise AssertionError("no error")
            except gdskit.SafetensorError as e:
                assert isinstance(e, ValueError) and "nope" in str(e)
            for index in ((0, 0, 0), (5,), (..., ..., 1)):
                try:
                    f.get_slice("w")[index]
                    raise AssertionError(index)
                except IndexError:
                    pass
            try:
                f.get_slice("w")[::-1]
                raise AssertionError("negative step")
            except ValueError:
                pass
        try:
            f.keys()
            raise AssertionError("closed file answered")
        except gdskit.SafetensorError:
            pass
        try:
            gdskit.safe_open(os.path.join(d, "missing.safetensors"))
            raise AssertionError("no error")
        except FileNotFoundError as e:
            assert e.errno == errno.ENOENT and e.filename.endswith("missing.safetensors")
        try:
            gdskit.safe_open(d)
            raise AssertionError("no error")
        except IsADirectoryError as e:
            assert e.filename == d


def test_slice_reads_only_the_needed_ranges():
    try:
        import numpy as np
    except ImportError:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "big.safetensors")
        rows, cols = 256, 8192  # 32 KiB rows: a column's values lie far apart
        raw = np.arange(rows * cols, dtype=np.float32)
        write_st(p, {"w": ("F32", (rows, cols), raw.tobytes())})
        full = raw.reshape(rows, cols)
        with gdskit.safe_open(p, framework="np") as f:
            sl = f.get_slice("w")
            for index in (np.s_[3], np.s_[10:12], np.s_[:, 5], np.s_[::64, 100:110], np.s_[..., 7:9],
                          np.s_[2:200:50, ::3], np.s_[5, ::1000], np.s_[-1, -3:]):
                got = sl[index]
                assert np.array_equal(got, full[index]), index
                # Only what the slice needs, plus gaps of at most a page between its contiguous pieces (one
                # request reads through those).
                read, requests, _ = f._slice_reads
                flat = np.arange(full.size).reshape(full.shape)[index].ravel()
                gaps = int(np.count_nonzero(np.diff(flat) != 1))
                assert read <= got.nbytes + 4096 * gaps, (index, read, got.nbytes)
                assert read < full.nbytes // 10, (index, read)
                assert requests <= gaps + 1, (index, requests, gaps)
            sl[7]
            assert f._slice_reads[:2] == (4 * cols, 1), f._slice_reads


def test_devices_everywhere():
    torch = _torch_or_skip()
    with tempfile.TemporaryDirectory() as d:
        p = _tmp_model(d)
        from gdskit._devices import _parse as parse_device  # the syntax alone (no check that the GPU exists)
        forms = [("cpu", -1), ("cuda:3", 3), ("cuda:0", 0), (2, 2), (0, 0)]
        if torch is not None:
            forms += [(torch.device("cpu"), -1), (torch.device("cuda:1"), 1), (torch.device("cuda", 2), 2)]
        try:
            import numpy as np
            forms.append((np.int64(1), 1))
        except ImportError:
            pass
        for form, want in forms:
            assert parse_device(form) == want, (form, parse_device(form))
        # The default device is the CPU.
        tensors, stats = gdskit.load_safetensors_raw(p)
        assert tensors["w"].device == -1 and stats["path"] == "host"
        if torch is not None:
            assert gdskit.load_safetensors(p)["w"].device.type == "cpu"
            assert gdskit.load_file(p, device=torch.device("cpu"))["w"].device.type == "cpu"
        for bad, kind in (("tpu", ValueError), ("cuda:x", ValueError), ("cuda:-1", ValueError), (-1, ValueError),
                          (1.5, TypeError), (None, TypeError), (True, TypeError), (b"cpu", TypeError),
                          ("cuda:1x", ValueError), (" cpu", ValueError)):
            for call in (lambda: gdskit.load_safetensors_raw(p, device=bad), lambda: gdskit.load_file(p, bad),
                         lambda: gdskit.safe_open(p, device=bad), lambda: gdskit.plan(p, bad)):
                try:
                    call()
                    raise AssertionError(f"device {bad!r} accepted")
                except kind:
                    pass
        # Bad arguments are ValueError/TypeError, never the binding's own error.
        for kwargs, kind in (({"rank": "0", "world": 2}, TypeError), ({"rank": -1, "world": 2}, ValueError),
                             ({"only": [3]}, TypeError), ({"allocate": 5}, TypeError)):
            try:
                gdskit.load_safetensors_raw(p, **kwargs)
                raise AssertionError(kwargs)
            except kind:
                pass
        try:
            gdskit.load_safetensors_raw(42)
            raise AssertionError("path 42 accepted")
        except TypeError:
            pass


def test_plan_without_gpu_is_enodev():
    ok, why = gdskit.gpu_available()
    if ok:
        return "skip: a GPU is available here"
    with tempfile.TemporaryDirectory() as d:
        p = _tmp_model(d)
        for device in ("cuda:0", "cuda", 0):
            try:
                gdskit.plan(p, device)
                raise AssertionError("planned a GPU read without a GPU")
            except OSError as e:
                assert e.errno == errno.ENODEV, e
        assert gdskit.plan(p, "cpu")[0] == "host"
    return None


def test_allocate_is_checked():
    try:
        import numpy as np
    except ImportError:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = _tmp_model(d)
        kept = []

        def good(n):
            kept.append(np.zeros(n + 16, dtype=np.uint8))
            return kept[-1]

        tensors, _ = gdskit.load_safetensors_raw(p, allocate=good)
        assert tensors["w"].tobytes() == TENSORS["w"][2]
        for bad, kind in ((lambda n: np.zeros(max(n - 1, 0), dtype=np.uint8), ValueError),   # too small
                          (lambda n: np.zeros((n + 8, 2), dtype=np.uint8)[:, 0], ValueError),  # not contiguous
                          (lambda n: 12345678, TypeError),                                     # an address
                          (lambda n: memoryview(bytearray(n)), TypeError)):
            try:
                gdskit.load_safetensors_raw(p, allocate=bad)
                raise AssertionError("bad allocation accepted")
            except kind:
                pass
        # The tensors keep the caller's allocation alive.
        del kept[:]
        tensors, _ = gdskit.load_safetensors_raw(p, allocate=lambda n: np.zeros(n, dtype=np.uint8))
        import gc
        gc.collect()
        assert tensors["w"].tobytes() == TENSORS["w"][2]


def test_malformed_shapes_and_indexes():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "huge.safetensors")
        big = 2 ** 64 - 1
        write_st(p, {"x": ("U8", (0, big, big), b"")})
        for call in (lambda: gdskit.load_safetensors_raw(p), lambda: gdskit.header(p), lambda: gdskit.safe_open(p)):
            try:
                call()
                raise AssertionError("a dimension past 2^63-1 was accepted")
            except gdskit.SafetensorError as e:
                assert isinstance(e, ValueError) and e.errno == errno.EBADMSG
        os.mkdir(os.path.join(d, "model.safetensors.index.json"))
        for target in (d, os.path.join(d, "model.safetensors.index.json")):
            try:
                gdskit.load_safetensors_raw(target)
                raise AssertionError("an index folder loaded")
            except IsADirectoryError as e:
                assert e.filename.endswith("model.safetensors.index.json"), e.filename


def test_file_read_write_and_futures():
    try:
        import numpy as np
    except ImportError:
        return "skip: numpy not installed"
    import asyncio
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "data.bin")
        data = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8)
        with gdskit.File(p, "w") as f:
            assert f.write(data, file_offset=0) == data.nbytes
            fut = f.pwrite(data[:4096].copy(), file_offset=data.nbytes)
            assert isinstance(fut, __import__("concurrent.futures").futures.Future)
            assert fut.result() == 4096
            assert f.size == data.nbytes + 4096
        with gdskit.File(p) as f:
            assert f.plan("cpu")[0] == "host" and f.plan(data)[0] == "host"
            out = np.zeros(1000, dtype=np.uint8)
            assert f.read(out, file_offset=123) == 1000 and out.tobytes() == data[123:1123].tobytes()
            futs = [f.pread(np.zeros(65536, dtype=np.uint8), file_offset=i * 65536) for i in range(8)]
            assert [x.result() for x in futs] == [65536] * 8

            async def both():
                a, b = np.zeros(10, dtype=np.uint8), np.zeros(10, dtype=np.uint8)
                n1 = await f.pread(a, file_offset=0)
                n2 = await asyncio.wrap_future(f.pread(b, offset=10))
                return n1, n2, a.tobytes() + b.tobytes()

            n1, n2, got = asyncio.run(both())
            assert (n1, n2, got) == (10, 10, data[:20].tobytes())
            # At the end of the file: the bytes that exist.
            assert f.read(np.zeros(100, dtype=np.uint8), file_offset=data.nbytes + 4096 - 30) == 30
            # Errors: read-only arrays, non-contiguous ones, other objects, negative offsets, writes to "r".
            for call, kind in ((lambda: f.read(np.frombuffer(b"abc", dtype=np.uint8)), ValueError),
                               (lambda: f.read(np.zeros((4, 4), dtype=np.uint8)[:, 1]), ValueError),
                               (lambda: f.read(bytearray(4)), TypeError),
                               (lambda: f.read(out, file_offset=-1), ValueError),
                               (lambda: f.write(out), OSError)):
                try:
                    call()
                    raise AssertionError("accepted")
                except kind:
                    pass
        assert f.closed
        try:
            f.read(out)
            raise AssertionError("read after close")
        except ValueError:
            pass
        for mode, kind in (("rw", ValueError), ("a", ValueError), ("", ValueError), (3, TypeError)):
            try:
                gdskit.File(p, mode)
                raise AssertionError(mode)
            except kind:
                pass
        try:
            gdskit.File(p, "x")
            raise AssertionError("x opened an existing file")
        except FileExistsError as e:
            assert e.filename == p
        try:
            gdskit.File(d)
            raise AssertionError("opened a folder")
        except IsADirectoryError:
            pass
        fifo = os.path.join(d, "pipe")
        os.mkfifo(fifo)
        for mode in ("r", "w"):
            try:
                gdskit.File(fifo, mode)  # must not block
                raise AssertionError("opened a FIFO")
            except OSError as e:
                assert e.errno == errno.EINVAL, e


def test_write_gather_checks_then_writes():
    import ctypes
    from gdskit import _gdskit
    bufs = [ctypes.create_string_buffer(os.urandom(n), n) for n in (1000, 77777, 4096, 1)]
    ranges = [(ctypes.addressof(b), len(b), off, -1) for b, off in zip(bufs, (5, 2000, 90000, 100000))]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "g.bin")
        f = _gdskit.FileHandle(p, "w")
        try:
            bad = list(ranges)
            bad[2] = (bad[2][0], bad[2][1], 2001, -1)  # overlaps the second range
            try:
                f.write_gather(bad)
                raise AssertionError("overlapping ranges were accepted")
            except OSError as e:
                assert e.errno == errno.EINVAL, e
            assert os.path.getsize(p) == 0  # nothing written by the refused call
            assert f.write_gather(list(reversed(ranges))) == sum(len(b) for b in bufs)
        finally:
            f.close()
        data = open(p, "rb").read()
        for b, (_, n, off, _) in zip(bufs, ranges):
            assert data[off:off + n] == b.raw
        assert data[:5] == b"\0" * 5 and data[1005:2000] == b"\0" * 995


def test_file_torch_tensors():
    torch = _torch_or_skip()
    if torch is None:
        return "skip: torch not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.bin")
        src = torch.arange(1000, dtype=torch.float32)
        with gdskit.File(p, "w+") as f:
            assert f.write(src) == 4000
            dst = torch.empty(1000, dtype=torch.float32)
            assert f.pread(dst).result() == 4000 and torch.equal(src, dst)
            try:
                f.read(torch.empty(10, 10)[:, 0])
                raise AssertionError("non-contiguous tensor accepted")
            except ValueError:
                pass
    return None



@pytest.mark.gpu
def test_gpu_api():
    """On a GPU machine: load_file, safe_open and File with CUDA devices give what the CPU gives."""
    torch = _torch_or_skip()
    if torch is None:
        return "skip: torch not installed"
    ok, why = gdskit.gpu_available()
    if not ok or not torch.cuda.is_available():
        return f"skip: no usable GPU ({why or 'torch.cuda.is_available() is False'})"
    path = os.path.join(GOLDEN, "llama_like.safetensors")
    cpu = gdskit.load_file(path)
    for device in ("cuda:0", "cuda", 0, torch.device("cuda:0")):
        gpu = gdskit.load_file(path, device=device)
        assert list(gpu) == list(cpu)
        for k in cpu:
            assert gpu[k].device.type == "cuda" and torch.equal(gpu[k].cpu(), cpu[k]), k
    with gdskit.safe_open(path, framework="pt", device="cuda:0") as f:
        name = f.keys()[0]
        assert torch.equal(f.get_tensor(name).cpu(), cpu[name])
        sl = f.get_slice(name)[1:3, ::2]
        assert sl.device.type == "cuda" and torch.equal(sl.cpu(), cpu[name][1:3, ::2])
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "g.bin")
        data = os.urandom(3 << 20)
        with open(p, "wb") as out:
            out.write(data)
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
        with gdskit.File(p) as f:
            assert f.read(x, file_offset=12345) == x.numel()
            assert x.cpu().numpy().tobytes() == data[12345:12345 + x.numel()]
            y = torch.empty_like(x)
            assert f.pread(y, file_offset=4096).result() == y.numel()
            assert y.cpu().numpy().tobytes() == data[4096:4096 + y.numel()]
            kind, reasons = f.plan(x)
            assert kind in ("gds", "staged", "compat") and reasons, (kind, reasons)
        with gdskit.File(p, "r+") as f:
            assert f.write(x, file_offset=0) == x.numel()
        with open(p, "rb") as back:
            assert back.read(x.numel()) == data[12345:12345 + x.numel()]
    return None



def test_file_handle_reserve_sizes_the_file():
    """The binding behind the checkpoint writer's reservation: the file gets the size, reads as zeros, and is
    never shortened."""
    from gdskit import _gdskit

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "r.bin")
        f = _gdskit.FileHandle(p, "w")
        try:
            assert isinstance(f.reserve(12345), bool)
            assert f.size() == 12345
            f.reserve(100)
            assert f.size() == 12345
        finally:
            f.close()
        with open(p, "rb") as back:
            assert back.read() == bytes(12345)
