#!/usr/bin/env python3
"""safe_open(...).get_slice(name)[index] against numpy's own indexing, on random shapes, dtypes and indexes, and
the compiled slice reader with a tiny staging budget (many rounds) against the same answers.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_slices.py
"""
import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support import error_of, import_gdskit, optional, run_as_script  # noqa: E402

gdskit = import_gdskit()
np = optional("numpy")

_DTYPES = {"F32": "float32", "F16": "float16", "I64": "int64", "U8": "uint8", "BOOL": "bool", "BF16": "uint16"}


def _write(path, tensors, lead=0):
    """tensors: {name: (dtype, array)}; `lead` bytes of another tensor first, so offsets are unaligned."""
    header, data = {}, b"\x5a" * lead
    if lead:
        header["pad"] = {"dtype": "U8", "shape": [lead], "data_offsets": [0, lead]}
    for name, (dtype, a) in tensors.items():
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def _random_index(rng, shape):
    items = []
    for n in shape:
        kind = rng.integers(0, 4)
        if kind == 0:
            items.append(int(rng.integers(-n, n)))
        elif kind == 1:
            items.append(slice(None))
        else:
            a, b = sorted(int(x) for x in rng.integers(-n - 2, n + 2, 2))
            items.append(slice(a, b, int(rng.integers(1, 4))))
    if len(items) > 1 and rng.integers(0, 4) == 0:
        at = int(rng.integers(0, len(items)))
        items = items[:at] + [Ellipsis] + items[at + 2:]
    if rng.integers(0, 3) == 0:
        items = items[: int(rng.integers(1, len(items) + 1))]  # fewer indices than dimensions
    return tuple(items)


def test_random_slices_match_numpy():
    if np is None:
        return "skip: numpy not installed"
    rng = np.random.default_rng(2026)
    with tempfile.TemporaryDirectory() as d:
        for case in range(12):
            ndim = int(rng.integers(1, 5))
            shape = tuple(int(x) for x in rng.integers(1, 9, ndim))
            dtype = list(_DTYPES)[case % len(_DTYPES)]
            a = rng.integers(0, 256, int(np.prod(shape)) * np.dtype(_DTYPES[dtype]).itemsize, dtype=np.uint8)
            a = a.view(_DTYPES[dtype]).reshape(shape) if dtype != "BOOL" else (a % 2).astype(bool).reshape(shape)
            p = os.path.join(d, f"s{case}.safetensors")
            _write(p, {"t": (dtype, a)}, lead=int(rng.integers(0, 7)))
            with gdskit.safe_open(p, framework="np") as f:
                sl = f.get_slice("t")
                for _ in range(25):
                    index = _random_index(rng, shape)
                    want = a[index]
                    got = sl[index]
                    assert got.shape == want.shape and got.dtype == want.dtype, (shape, index)
                    assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (shape, index)  # NaNs too


def test_reader_rounds_and_gaps_give_the_same_bytes():
    """Small staging budgets cut a slice into many rounds and runs; every budget gives numpy's bytes."""
    if np is None:
        return "skip: numpy not installed"
    from gdskit import _gdskit

    rows, cols = 64, 300
    a = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        _write(p, {"t": ("I32", a)}, lead=3)
        info = [e for e in gdskit.header(p)[0] if e["name"] == "t"][0]
        h = _gdskit.FileHandle(p, "r")
        try:
            for picks, index in (([(0, 64, 1), (5, 100, 2)], np.s_[:, 5:205:2]),   # gaps inside a page: runs
                                 ([(3, 20, 3), (0, 300, 1)], np.s_[3:63:3, :]),    # whole rows, far apart
                                 ([(0, 64, 1), (7, 1, 1)], np.s_[:, 7:8]),         # one value per row
                                 ([(10, 5, 1), (0, 300, 1)], np.s_[10:15, :])):    # one contiguous range
                want = np.ascontiguousarray(a[index])
                for budget in (2, 64, 4096, 1 << 20):
                    out = np.zeros(want.size, dtype=np.int32)
                    got, requests, held = _gdskit.read_slice(h, info["file_offset"], [rows, cols], 4, picks,
                                                             out.ctypes.data, out.nbytes, -1, budget)
                    assert np.array_equal(out.reshape(want.shape), want), (index, budget)
                    assert got >= out.nbytes and requests >= 1, (got, requests)
                    # Within the budget, once it holds a run's bookkeeping (below that, one run per round).
                    assert budget < 4096 or held <= budget, (index, budget, held)
            # Picks past the shape, or a destination too small, are refused before any read.
            out = np.zeros(10, dtype=np.int32)
            error_of(IndexError, lambda: _gdskit.read_slice(h, info["file_offset"], [rows, cols], 4,
                                                            [(60, 5, 1), (0, 1, 1)], out.ctypes.data, 40, -1))
            e = error_of(ValueError, lambda: _gdskit.read_slice(h, info["file_offset"], [rows, cols], 4,
                                                                [(0, 2, 1), (0, 300, 1)], out.ctypes.data, 40, -1))
            assert isinstance(e, gdskit.InvalidArgumentError), e
        finally:
            h.close()


def test_cut_file_is_an_error_not_a_short_slice():
    if np is None:
        return "skip: numpy not installed"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        a = np.arange(4096, dtype=np.float32).reshape(64, 64)
        _write(p, {"t": ("F32", a)})
        with gdskit.safe_open(p, framework="np") as f:
            sl = f.get_slice("t")
            with open(p, "r+b") as raw:  # cut the file after the header was read
                raw.truncate(os.path.getsize(p) - 1000)
            e = error_of(OSError, lambda: sl[60:, :])
            assert e.filename == p and "ended" in str(e), e


def test_index_rules_are_the_compiled_modules():
    """What an index may hold (ints, slices with a positive step, one ...), and the errors for the rest, come
    from the compiled module (slice_picks): the same types and words numpy's users expect."""
    from gdskit import _gdskit

    picks = _gdskit.slice_picks
    assert picks((1, slice(None, None, 2)), [3, 5], 4) == ([(1, 1, 1), (0, 3, 2)], [3], 12)
    assert picks((Ellipsis, -1), [2, 3, 4], 2) == ([(0, 2, 1), (0, 3, 1), (3, 1, 1)], [2, 3], 12)
    assert picks(Ellipsis, [], 8) == ([], [], 8)
    assert picks(slice(5, 1), [4], 1)[1:] == ([0], 0)
    assert picks(slice(-100, 100), [4], 1) == ([(0, 4, 1)], [4], 4)
    big = 2 ** 70
    cases = [([0], TypeError, "lists are not supported"),
             ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
             ((0, 0, 0), IndexError, "too many indices for tensor of dimension 2"),
             ((True,), TypeError, "only ints, slices and ..."),
             ((1.0,), TypeError, "only ints, slices and ..."),
             ((slice(None, None, -1),), ValueError, "slice step must be positive, not -1"),
             ((slice(None, None, 0),), ValueError, "zero"),
             ((3,), IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
             ((-4,), IndexError, "index -4 is out of bounds"),
             ((big,), IndexError, f"index {big} is out of bounds"),
             ((0, slice("a", None)), TypeError, "")]
    for index, kind, words in cases:
        e = error_of(kind, lambda: picks(index, [3, 5], 4))
        assert words in str(e), (index, str(e))
    if np is not None:
        assert picks((np.int64(2), np.int32(-1)), [3, 5], 4)[0] == [(2, 1, 1), (4, 1, 1)]


if __name__ == "__main__":
    run_as_script(globals())
