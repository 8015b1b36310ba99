#!/usr/bin/env python3
"""Hostile and odd inputs at the Python surface: paths with NUL bytes or unencodable characters, names that are
not UTF-8 text, absurd shard sizes, CUDA devices without a GPU, conjugate and negative views, and saves of many
small arrays (the shared-memory check must stay n log n).

    PYTHONPATH=<build>/python /usr/bin/python3 -m pytest python/tests/test_safety.py
Parts that need torch or numpy skip with the reason.
"""
import errno
import os
import struct
import sys
import tempfile
import time

import gdskit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gdskit import write_st  # noqa: E402  (the one safetensors writer of the tests)
from test_save import _np, _torch  # noqa: E402


def _raises(exc, fn, *args, **kwargs):
    """Calls fn and returns the exception it raised, which must be an `exc` (never pybind's TypeError for
    arguments it could not convert)."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert "incompatible function arguments" not in str(e), e
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} must raise {exc.__name__}")


def test_nul_and_unencodable_paths_are_value_errors():
    # As Python's own open(): a NUL byte is a ValueError, a str that has no bytes in the file system's encoding
    # (a lone surrogate outside the surrogateescape range) a UnicodeEncodeError, which is a ValueError too.
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "m.safetensors")
        write_st(good, {"w": ("U8", (2,), b"ab")})
        for bad in (good + "\0x", os.path.join(d, "\ud800.safetensors")):
            calls = [
                (gdskit.load_safetensors_raw, (bad,)),
                (gdskit.header, (bad,)),
                (gdskit.load_file, (bad,)),
                (gdskit.safe_open, (bad,)),
                (gdskit.File, (bad,)),
                (gdskit.read, (bad, bytearray(2))),
                (gdskit.plan, (bad, "cpu")),
            ]
            np = _np()
            if np is not None:
                calls += [(gdskit.load_safetensors, (bad,)),
                          (gdskit.save_file, ({"a": np.zeros(2)}, bad)),
                          (gdskit.save_sharded, ({"a": np.zeros(2)}, bad))]
            for fn, args in calls:
                e = _raises(ValueError, fn, *args)
                assert isinstance(e, ValueError), (fn, e)
        assert sorted(os.listdir(d)) == ["m.safetensors"], os.listdir(d)
    return None


def test_names_that_are_not_utf8_text_are_value_errors():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        lone = "w\ud800"
        e = _raises(ValueError, gdskit.save_file, {lone: np.zeros(2)}, p)
        assert "UTF-8" in str(e), e
        _raises(ValueError, gdskit.save_file, {"a": np.zeros(2)}, p, metadata={lone: "v"})
        _raises(ValueError, gdskit.save_file, {"a": np.zeros(2)}, p, metadata={"k": lone})
        _raises(ValueError, gdskit.save_sharded, {lone: np.zeros(2)}, os.path.join(d, "s"))
        assert not os.listdir(d)
        write_st(p, {"w": ("U8", (2,), b"ab")})
        _raises(ValueError, gdskit.load_safetensors_raw, p, only=[lone])
        _raises(ValueError, gdskit.load_safetensors, p, only=lone)
    return None


def test_shard_sizes_beyond_64_bits_or_not_finite_are_value_errors():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        for size in ("1e30GB", "infGB", "-infGB", "nanGB", "1e400MB", 2 ** 64, 2 ** 70, "18446744073709551616KB"):
            e = _raises(ValueError, gdskit.save_sharded, {"a": np.zeros(2)}, d, max_shard_size=size)
            assert not isinstance(e, OverflowError), (size, e)
        assert not os.listdir(d)
        # The largest size that fits is taken: one shard.
        written = gdskit.save_sharded({"a": np.zeros(2)}, d, max_shard_size=2 ** 64 - 1)
        assert [os.path.basename(w) for w in written] == ["model.safetensors"]
    return None


def test_cuda_device_without_a_gpu_is_enodev():
    ok, why = gdskit.gpu_available()
    if ok:
        return "skip: a GPU is usable here"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        write_st(p, {"w": ("F32", (2,), struct.pack("<2f", 1, 2))})
        calls = [(gdskit.load_safetensors_raw, (p,), {"device": "cuda:0"})]
        if _torch() is not None:
            calls += [(gdskit.safe_open, (p,), {"framework": "pt", "device": "cuda:0"}),
                      (gdskit.load_file, (p,), {"device": "cuda:0"}),
                      (gdskit.load_safetensors, (p,), {"device": "cuda:0", "framework": "torch"})]
        for fn, args, kwargs in calls:
            try:
                fn(*args, **kwargs)
                raise AssertionError(f"{fn.__name__} on cuda:0 must fail without a GPU")
            except OSError as e:
                assert e.errno == errno.ENODEV, (fn.__name__, e)
                assert why and why in str(e), (fn.__name__, str(e), why)
    return None


def _check_shared(arrays):
    from gdskit import _save  # noqa: PLC0415

    _save._check_shared(arrays)


def test_numpy_shared_memory_check_is_n_log_n():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    # The pairwise check took 97-124 s for 16,000 arrays; sorted by address (in the compiled module) it takes
    # milliseconds.
    arrays = {f"t{i}": np.full(4, i, dtype=np.float32) for i in range(20000)}
    t0 = time.monotonic()
    _check_shared(arrays)
    took = time.monotonic() - t0
    # A bound far from both: quadratic would take minutes; a loaded or sanitized run stays well under it.
    assert took < 3.0, f"checking 20,000 arrays took {took:.2f} s"
    # ... and still finds what shares memory, at any distance in the dict.
    base = np.zeros(100, dtype=np.uint8)
    big = dict(arrays, first=base[:10], last=base[5:20])
    e = _raises(RuntimeError, _check_shared, big)
    assert "{'first', 'last'}" in str(e) or "{'last', 'first'}" in str(e), e
    # Interleaved strided views share a span but no byte: allowed, as before.
    grid = np.zeros((4, 6), dtype=np.float32)
    _check_shared({"even": grid[:, ::2], "odd": grid[:, 1::2], "other": np.zeros(3)})
    _check_shared({"lo": base[:50], "hi": base[50:], "empty": base[:0], "also_empty": base[:0]})
    for bad in ({"a": base, "b": base}, {"a": base[::2], "b": base[2:3]}, {"a": grid[:, ::2], "b": grid.T[2]},
                {"a": base[10:30], "b": base[::-1][75:85]}, {"a": np.broadcast_to(base[7:8], (5, 3)), "b": base[7:]}):
        _raises(RuntimeError, _check_shared, bad)
    # Overlapping views chained through a third are one group; others stay apart.
    e = _raises(RuntimeError, _check_shared, {"x": base[0:10], "y": base[8:20], "z": base[19:30], "w": base[40:50],
                                               "u": grid, "v": grid[1:2]})
    assert "'x'" in str(e) and "'z'" in str(e) and "'w'" not in str(e) and "'u'" in str(e), e
    return None


def test_save_of_16000_numpy_arrays_is_fast():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    arrays = {f"layer.{i}.w": np.full(8, i, dtype=np.int32) for i in range(16000)}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "many.safetensors")
        t0 = time.monotonic()
        gdskit.save_file(arrays, p)
        took = time.monotonic() - t0
        assert took < 30, f"saving 16,000 small arrays took {took:.1f} s"
        back = gdskit.load_safetensors(p, framework="numpy")
        assert len(back) == 16000 and all(np.array_equal(back[k], a) for k, a in arrays.items())
    return None


def test_conjugate_and_negative_views_are_saved_as_their_values():
    torch = _torch()
    if torch is None:
        return "skip: torch not installed"
    g = torch.Generator().manual_seed(7)
    c = torch.complex(torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g))
    x = torch.randn(9, 4, generator=g)
    views = {"conj": c.conj(), "conj_t": c.t().conj(), "conj_row": c.conj()[2]}
    if hasattr(torch, "_neg_view"):
        views.update(neg=torch._neg_view(x), neg_t=torch._neg_view(x).t(), neg_conj=torch._neg_view(c.conj()))
    assert views["conj"].is_conj()
    with tempfile.TemporaryDirectory() as d:
        for staging in (gdskit._save.STAGING_BYTES, 40):  # whole, and a few rows at a time
            p = os.path.join(d, f"v{staging}.safetensors")
            # With the originals in the same file: the resolved values are other bytes, not shared memory.
            gdskit.save_file(dict(views, c=c, x=x), p, staging_bytes=staging)
            back = gdskit.load_file(p)
            for k, v in views.items():
                want = v.resolve_conj().resolve_neg() if hasattr(v, "resolve_neg") else v.resolve_conj()
                assert torch.equal(back[k], want), k
            assert torch.equal(back["c"], c) and torch.equal(back["x"], x)
        # The tensors passed in are unchanged (no resolution in place).
        assert views["conj"].is_conj() and torch.equal(c.conj().imag, -c.imag)
    return None


def test_slices_read_through_a_bounded_window():
    np = _np()
    if np is None:
        return "skip: numpy not installed"
    from gdskit import _safetensors  # noqa: PLC0415

    rng = np.random.default_rng(5)
    near = rng.integers(0, 256, 4096 * 4096, dtype=np.uint8).reshape(4096, 4096)  # rows 4 KiB apart
    far = rng.integers(0, 256, 1024 * 8192, dtype=np.uint8).reshape(1024, 8192)   # rows 8 KiB apart
    saved = _safetensors._SLICE_MEMORY_BYTES
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        write_st(p, {"near": ("U8", near.shape, near.tobytes()), "far": ("U8", far.shape, far.tobytes())})
        try:
            # A small bound, so that what it bounds shows against the 16 MiB and 8 MiB tensors. The slice reports
            # the most memory one round of its reads held beyond the result (staging, segment offsets, ranges and
            # their results, measured from the containers that hold them).
            bound = 64 << 10
            _safetensors._SLICE_MEMORY_BYTES = bound
            with gdskit.safe_open(p, framework="np") as f:
                for name, full, index in (
                        ("near", near, (slice(None), 5)),                   # through the gaps, a window at a time
                        ("near", near, (slice(None), slice(None, None, 2))),  # 8M one-byte segments (64 MiB of offsets)
                        ("near", near, (slice(3, 4000, 7), slice(10, 20))),
                        ("far", far, (slice(None), 5)),                     # 1024 requests of one byte each
                        ("far", far, (Ellipsis, slice(8000, None, 3)))):
                    got = f.get_slice(name)[index]
                    assert np.array_equal(got, full[index]), (name, index)
                    read, requests, held = f._slice_reads
                    assert 0 < held <= bound, (name, index, held)
                    assert requests > 1, (name, index, requests)
            # Round edges everywhere: random slices of a 3-d tensor under bounds from a few runs per round to one,
            # against numpy's own slicing.
            small = np.random.default_rng(6).integers(0, 2**31, 9 * 37 * 41, dtype=np.int32)
            q = os.path.join(d, "small.safetensors")
            write_st(q, {"y": ("I32", (9, 37, 41), small.tobytes())})
            cube = small.reshape(9, 37, 41)
            with gdskit.safe_open(q, framework="np") as f:
                for bound in (4096, 700, 1):
                    _safetensors._SLICE_MEMORY_BYTES = bound
                    for _ in range(40):
                        index = tuple(slice(int(rng.integers(0, n)), int(rng.integers(0, n + 1)),
                                            int(rng.integers(1, 4)))
                                      if rng.random() < 0.8 else int(rng.integers(0, n)) for n in cube.shape)
                        assert np.array_equal(f.get_slice("y")[index], cube[index]), (bound, index)
        finally:
            _safetensors._SLICE_MEMORY_BYTES = saved
    return None


def test_npy_header_text_in_messages_is_escaped():
    if not hasattr(gdskit, "gather_rows"):
        return "skip: this gdskit has no gather_rows"
    with tempfile.TemporaryDirectory() as d:
        for descr in ("<\x1b[2Jf4", "<f\x1b]0;x\x07", "\x1b\u009b"):
            header = "{'descr': '%s', 'fortran_order': False, 'shape': (2,), }" % descr
            raw = header.encode("utf-8")
            raw += b" " * ((64 - (10 + len(raw) + 1) % 64) % 64) + b"\n"
            p = os.path.join(d, "x.npy")
            with open(p, "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + bytes(8))
            e = _raises(OSError, gdskit.gather_rows, p, [0])
            assert e.errno == errno.EBADMSG, e
            for raw_char in ("\x1b", "\x07", "\u009b"):
                assert raw_char not in str(e), str(e)
    return None
