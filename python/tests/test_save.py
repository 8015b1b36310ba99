#!/usr/bin/env python3
"""Tests of gdskit.save_file / gdskit.save_sharded on the CPU (torch and numpy parts skip when missing).

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_save.py
The expected bytes come from `reference_bytes`, an independent writer of the format's rules (order by
descending dtype alignment then name, compact JSON, "__metadata__" first, spaces to a multiple of 8); where
the safetensors package is installed the files are also compared with safetensors.torch.save_file's.
"""
import errno
import json
import os
import struct
import tempfile
import time

import gdskit

# The format's dtypes in safetensors' Dtype enum order (increasing alignment).
RANK = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
        "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]


def reference_bytes(tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw bytes)} -> the file safetensors writes."""
    order = sorted(tensors, key=lambda n: (-RANK.index(tensors[n][0]), n.encode()))
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for n in order:
        dtype, shape, raw = tensors[n]
        header[n] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _read(p):
    with open(p, "rb") as f:
        return f.read()


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _np():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


TORCH_ST = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
            "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "complex64": "C64",
            "uint16": "U16", "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def _torch_state(torch):
    g = torch.Generator().manual_seed(3)
    out = {}
    for name, st in TORCH_ST.items():
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        base = torch.randint(0, 200, (7, 13), generator=g, dtype=torch.int64)
        out[f"m.{name}"] = base.to(torch.float32).to(dt) if dt.is_floating_point or dt.is_complex else base.to(dt)
        out[f"s.{name}"] = out[f"m.{name}"][0, 0].clone()  # 0-d
        out[f"e.{name}"] = torch.empty((2, 0), dtype=dt)   # empty
    out["big"] = torch.randn(513, 1031, generator=g)
    return out


def _torch_ref(torch, tensors):
    ref = {}
    for k, v in tensors.items():
        c = v.contiguous()
        raw = c.view(torch.uint8).numpy().tobytes() if c.numel() and c.dim() else \
            c.reshape(1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
        ref[k] = (TORCH_ST[str(v.dtype).split(".")[-1]], list(v.shape), raw)
    return ref


def test_torch_every_dtype_matches_reference_and_round_trips():
    torch = _torch()
    if torch is None:
        return "skip: torch not installed"
    t = _torch_state(torch)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        gdskit.save_file(t, p, metadata={"format": "pt"})
        assert _read(p) == reference_bytes(_torch_ref(torch, t), {"format": "pt"})
        back, _ = gdskit.load_safetensors_raw(p, device="cpu")
        ref = _torch_ref(torch, t)
        assert set(back) == set(t)
        for k in t:
            assert back[k].dtype == ref[k][0] and list(back[k].shape) == list(t[k].shape), k
            assert back[k].tobytes() == ref[k][2], k
        stats = gdskit.last_save_stats()
        assert stats["files"] == 1 and stats["written"] == [p]
        assert stats["tensor_bytes"] == sum(v.numel() * v.element_size() for v in t.values())
        assert os.listdir(d) == ["m.safetensors"]
    return None


def test_torch_matches_safetensors_itself():
    torch = _torch()
    try:
        from safetensors.torch import save_file as st_save  # noqa: PLC0415
    except ImportError:
        return "skip: safetensors not installed"
    t = _torch_state(torch)
    with tempfile.TemporaryDirectory() as d:
        for md in (None, {}, {"format": "pt"}):
            a, b = os.path.join(d, "a.safetensors"), os.path.join(d, "b.safetensors")
            st_save(t, a, metadata=md)
            gdskit.save_file(t, b, metadata=md, overwrite=True)
            assert _read(a) == _read(b), md
    return None


def test_non_contiguous_through_a_small_staging_budget():
    torch = _torch()
    if torch is None:
        return "skip: torch not installed"
    base = torch.arange(64 * 50, dtype=torch.float32).reshape(64, 50)
    t = {"t": base.t(), "step": torch.arange(1000, dtype=torch.int16)[::3], "cols": base.clone()[:, 5:9]}
    assert not any(v.is_contiguous() for v in t.values())
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "nc.safetensors")
        gdskit.save_file(t, p, staging_bytes=300)
        assert _read(p) == reference_bytes(_torch_ref(torch, t))
        assert gdskit.last_save_stats()["pieces"] > 10  # staged in blocks, not whole
    return None


def test_one_staging_block_alive_across_strided_tensors():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    from gdskit import _save  # noqa: PLC0415

    # Strided tensors are written one after another: the first one's last block must be gone once the second
    # makes its own, or a save of several strided tensors holds one staging block per tensor.
    def contiguous(x):
        return np.ascontiguousarray(x)

    peers = []
    a = np.arange(400, dtype=np.float32).reshape(20, 20).T
    b = np.arange(400, dtype=np.float32).reshape(20, 20)[:, ::2]
    for arr in (a, b):
        peers.append(_save._RowStager(arr, arr.nbytes, 400, contiguous, lambda blk: blk.ctypes.data, peers))
    offset = 0
    while offset < a.nbytes:
        offset += peers[0](offset)[1]
    peers[1](0)
    blocks_alive = [s for s in peers if s.block is not None]
    assert blocks_alive == [peers[1]], "the first tensor's last block outlived it"
    return None


def test_shared_memory_is_refused_like_safetensors():
    torch = _torch()
    if torch is None:
        return "skip: torch not installed"
    a = torch.zeros(10)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        # One storage counts from first to last element, as safetensors judges: interleaved views share it too.
        for bad in ({"a": a, "b": a}, {"a": a, "b": a[2:5]}, {"a": a.view(2, 5), "b": a[4:]},
                    {"a": a[::2], "b": a[1::2]}):
            try:
                gdskit.save_file(bad, p)
                raise AssertionError("tensors sharing memory must be refused")
            except RuntimeError:
                pass
        # Disjoint views of one storage are fine, as in safetensors.
        gdskit.save_file({"lo": a[:5], "hi": a[5:]}, p)
        # Sorted by address: 20,000 tensors of their own are checked in well under a second.
        from gdskit import _save  # noqa: PLC0415

        many = {f"t{i}": torch.full((4,), i) for i in range(20000)}
        t0 = time.monotonic()
        _save._check_shared(many)
        assert time.monotonic() - t0 < 1, "checking 20,000 tensors"
        assert not [f for f in os.listdir(d) if ".gdskit-tmp." in f]
    return None


def test_bad_arguments():
    torch, np = _torch(), _np()
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        cases = [([1, 2], ValueError), ({"a": [1, 2]}, ValueError)]
        if np is not None:
            cases += [({1: np.zeros(2)}, TypeError), ({"__metadata__": np.zeros(2)}, ValueError),
                      ({"a": np.zeros(2, dtype=np.complex128)}, TypeError)]
        for tensors, exc in cases:
            try:
                gdskit.save_file(tensors, p)
                raise AssertionError(f"{tensors!r} must raise {exc.__name__}")
            except exc:
                pass
        if np is not None:
            for md in ({"a": 1}, {1: "a"}, ["a"]):
                try:
                    gdskit.save_file({"a": np.zeros(2)}, p, metadata=md)
                    raise AssertionError(f"metadata {md!r} must raise TypeError")
                except TypeError:
                    pass
            for size in ("5XB", "GB", -1, 0, 1.5):
                try:
                    gdskit.save_sharded({"a": np.zeros(2)}, d, max_shard_size=size)
                    raise AssertionError(f"max_shard_size {size!r} must raise ValueError")
                except ValueError:
                    pass
        assert not os.listdir(d)
        if torch is not None:
            try:
                gdskit.save_file({"a": torch.zeros(3).to_sparse()}, p)
                raise AssertionError("sparse tensors must be refused")
            except ValueError:
                pass
    return None


def test_replacing_keeps_the_old_file_whole_until_the_new_one_is_complete():
    """save_file over an existing file: while the new file is being written (a strided array is staged piece by
    piece, and each piece looks at the target), readers see the old file, whole; then the new one."""
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        old = {"a": np.arange(1000, dtype=np.float32)}
        gdskit.save_file(old, p)
        old_bytes = _read(p)
        seen = []

        big = np.arange(3 << 20, dtype=np.float32).reshape(-1, 2)[:, ::-1]  # strided: staged in pieces
        real = np.ascontiguousarray

        def watch(x):
            seen.append(_read(p) == old_bytes and not [n for n in os.listdir(d) if n != "m.safetensors"
                                                         and ".gdskit-tmp." not in n])
            return real(x)

        np.ascontiguousarray = watch
        try:
            gdskit.save_file({"b": big}, p, staging_bytes=1 << 20)
        finally:
            np.ascontiguousarray = real
        assert len(seen) > 3 and all(seen), seen
        back = gdskit.load_file(p) if _torch() is not None else None
        if back is not None:
            assert np.array_equal(back["b"].numpy(), big)
        # An interrupted replacement (an error while writing) leaves the old file as it was.
        gdskit.save_file(old, p)

        def fail(x):
            raise RuntimeError("stop")

        np.ascontiguousarray = fail
        try:
            gdskit.save_file({"b": big}, p, staging_bytes=1 << 20)
            raise AssertionError("the failing save succeeded")
        except RuntimeError:
            pass
        finally:
            np.ascontiguousarray = real
        assert _read(p) == old_bytes and os.listdir(d) == ["m.safetensors"]
    return None


def test_bytes_round_trip_like_safetensors_torch_save_and_load():
    """gdskit.save gives the bytes save_file writes; gdskit.load gives back tensors that own their memory."""
    torch = _torch()
    if torch is None:
        return "skip: torch not installed"
    tensors = {"w": torch.randn(33, 7), "b": torch.arange(5, dtype=torch.int16), "s": torch.tensor(3.5),
               "e": torch.zeros(0, 4, dtype=torch.float64), "t": torch.randn(8, 6).t(),  # strided
               "h": torch.randn(9).to(torch.bfloat16), "q": torch.tensor([True, False, True])}
    md = {"format": "pt", "x": "y"}
    data = gdskit.save(tensors, metadata=md)
    assert isinstance(data, bytes)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        gdskit.save_file(tensors, p, metadata=md)
        assert _read(p) == data
        assert gdskit.save(tensors) == _read_saved(gdskit, tensors, d)
        file_order = list(gdskit.load_file(p))
    for source in (data, bytearray(data), memoryview(data)):
        back = gdskit.load(source)
        assert list(back) == file_order
        for k, v in tensors.items():
            assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    # The tensors own a copy: changing the buffer afterwards changes nothing.
    buf = bytearray(data)
    back = gdskit.load(buf)
    buf[-1] ^= 0xFF
    assert torch.equal(back["q"], tensors["q"]) and torch.equal(back["w"], tensors["w"])
    for bad, kind in ((b"not a safetensors file at all", gdskit.SafetensorError), (data[:-3], gdskit.SafetensorError),
                      (b"", gdskit.SafetensorError), ("text", TypeError), (3, TypeError)):
        try:
            gdskit.load(bad)
            raise AssertionError(f"{bad!r} loaded")
        except kind:
            pass
    try:
        gdskit.load(b"hello world, not safetensors")
        raise AssertionError("text loaded")
    except gdskit.SafetensorError as e:
        assert "not a safetensors file" in str(e), e
    return None


def _read_saved(gdskit, tensors, d):
    p = os.path.join(d, "no-metadata.safetensors")
    gdskit.save_file(tensors, p)
    return _read(p)


def test_existing_file_and_os_errors_name_the_file():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        with open(p, "wb") as f:
            f.write(b"old")
        try:
            gdskit.save_file({"a": np.ones(3, dtype=np.float32)}, p, overwrite=False)
            raise AssertionError("an existing file must not be replaced with overwrite=False")
        except FileExistsError as e:
            assert e.errno == errno.EEXIST and e.filename == p
        assert _read(p) == b"old"
        gdskit.save_file({"a": np.ones(3, dtype=np.float32)}, p)  # replaced by default, as safetensors does
        assert _read(p) == reference_bytes({"a": ("F32", [3], np.ones(3, dtype=np.float32).tobytes())})
        missing = os.path.join(d, "no", "such", "folder", "x.safetensors")
        try:
            gdskit.save_file({"a": np.ones(3)}, missing)
            raise AssertionError("a missing folder must fail")
        except FileNotFoundError as e:
            assert "no/such/folder" in str(e.filename)
    return None


def test_numpy_dict_like_safetensors_numpy():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    rng = np.random.default_rng(1)
    arrays = {"f": rng.standard_normal((5, 7)).astype(np.float32), "i": np.arange(9, dtype=np.int64),
              "b": np.array([True, False, True]), "s": np.array(2.5),
              "nc": np.arange(200, dtype=np.uint16).reshape(10, 20)[:, ::3]}
    ref = {k: ({"float32": "F32", "int64": "I64", "bool": "BOOL", "float64": "F64", "uint16": "U16"}[a.dtype.name],
               list(a.shape), np.ascontiguousarray(a).tobytes()) for k, a in arrays.items()}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "n.safetensors")
        gdskit.save_file(arrays, p, metadata={"k": "v", "a": "b"})
        assert _read(p) == reference_bytes(ref, {"k": "v", "a": "b"})
        back, _ = gdskit.load_safetensors_raw(p, device="cpu")
        for k, a in arrays.items():
            assert back[k].tobytes() == np.ascontiguousarray(a).tobytes() and list(back[k].shape) == list(a.shape), k
    return None


def test_sharded_layout_and_round_trip():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    arrays = {f"layer_{i}": np.full(n, i, dtype=np.uint8) for i, n in enumerate([600, 1000, 3000, 200, 200], 1)}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ckpt")
        written = gdskit.save_sharded(arrays, out, max_shard_size="1KB")
        names = ["model-0000%d-of-00004.safetensors" % k for k in range(1, 5)]
        assert [os.path.basename(w) for w in written] == names + ["model.safetensors.index.json"]
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        assert index["metadata"] == {"total_size": 5000}
        assert index["weight_map"] == {"layer_1": names[0], "layer_3": names[1], "layer_2": names[2],
                                       "layer_4": names[3], "layer_5": names[3]}
        back = gdskit.load_safetensors(out, device="cpu", framework="numpy")
        for k, a in arrays.items():
            assert np.array_equal(back[k], a), k
        try:
            gdskit.save_sharded(arrays, out, max_shard_size="1KB")
            raise AssertionError("an existing checkpoint must not be replaced without overwrite")
        except FileExistsError:
            pass
        gdskit.save_sharded(arrays, out, max_shard_size="1KB", overwrite=True)
        assert sorted(os.listdir(out)) == sorted(names + ["model.safetensors.index.json"])
        single = os.path.join(d, "single")
        assert [os.path.basename(w) for w in gdskit.save_sharded(arrays, single)] == ["model.safetensors"]
    return None


def test_interrupt_publishes_nothing():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    import signal  # noqa: PLC0415

    big = np.zeros((4096, 2 * 8192), dtype=np.uint8)[:, ::2]  # 32 MiB, strided: staged in many small blocks

    def on_alarm(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.safetensors")
            signal.setitimer(signal.ITIMER_REAL, 0.02)
            try:
                gdskit.save_file({"big": big}, p, staging_bytes=16 << 10)
            except KeyboardInterrupt:
                assert os.listdir(d) == [], os.listdir(d)
                return None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            return "skip: the save finished before the signal came"
    finally:
        signal.signal(signal.SIGALRM, old)


def test_signals_during_a_save():
    """A save runs on the calling thread: Ctrl-C (a handler that raises) stops it between pieces and publishes
    nothing; a signal whose handler returns only restarts it, and the file is whole; an event loop's wakeup
    descriptor still hears of the signals."""
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    import signal  # noqa: PLC0415

    tensors = {f"t{i:03d}": np.full(1 << 20, i % 251, dtype=np.uint8) for i in range(256)}  # 256 MiB, 256 pieces
    heard = []

    def raising(signum, frame):
        raise KeyboardInterrupt

    def quiet(signum, frame):
        heard.append(signum)

    old = signal.signal(signal.SIGALRM, raising)
    loop_r, loop_w = os.pipe()  # an event loop's wakeup descriptor
    os.set_blocking(loop_r, False)
    os.set_blocking(loop_w, False)
    old_fd = signal.set_wakeup_fd(loop_w, warn_on_full_buffer=False)
    try:
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.safetensors")
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            try:
                gdskit.save_file(tensors, p)
                interrupted = False
            except KeyboardInterrupt:
                interrupted = True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if interrupted:
                assert os.listdir(d) == [], os.listdir(d)
                assert signal.SIGALRM in os.read(loop_r, 64), "the loop's wakeup descriptor missed the signal"
            signal.signal(signal.SIGALRM, quiet)
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            try:
                gdskit.save_file(tensors, p)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert heard == [signal.SIGALRM], heard
            assert gdskit.header(p)[0][0]["name"] == "t000" and os.listdir(d) == ["x.safetensors"]
            assert _read(p)[-1] == 255 % 251
            if not interrupted:
                return "skip: the save finished before the signal came"
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGALRM, old)
        os.close(loop_r)
        os.close(loop_w)
    return None

