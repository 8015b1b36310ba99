#!/usr/bin/env python3
"""Tests of the gdskit Python package that run without a GPU, torch or numpy (those parts skip with the reason).

    PYTHONPATH=<build>/python python3 python/tests/test_gdskit.py      # or: pytest python/tests
Exit status 77 when gdskit cannot be imported (not built with -DGDSKIT_BUILD_PYTHON=ON).
"""
import errno
import hashlib
import json
import os
import struct
import sys
import tempfile

try:
    import gdskit
except ImportError as e:  # pragma: no cover
    print(f"SKIP: cannot import gdskit ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH")
    sys.exit(77)


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
        except OSError as e:
            assert e.errno == errno.EINVAL


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


def main():
    failed = 0
    for name, fn in sorted(globals().items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        try:
            r = fn()
            print(f"{'SKIP' if r else 'PASS'} {name}{' (' + r + ')' if r else ''}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
