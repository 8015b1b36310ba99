#!/usr/bin/env python3
"""scripts/kv-e2e.py on the CPU: its cache layout (past_key_values <-> store blocks), block keys, page-cache
dropping and the whole run with tiny sizes.

    PYTHONPATH=<build>/python python3 -m pytest python/tests/test_kv_adapters_e2e.py

transformers is not installed here. The model-path test uses a TEST STAND-IN of the few transformers names the
script uses (LlamaConfig, LlamaForCausalLM with .model and .lm_head, DynamicCache with layers of keys/values
and update()): a small causal attention model written for this test, so the script's prefill / offload / free /
restore / continue sequence and its equality check run for real. The store is the in-memory stand-in of
the real gdskit.kv.BlockStore on temporary folders.
"""
import importlib.util
import os
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import torch
except ImportError as e:  # pragma: no cover
    pytest.skip(f"SKIP: torch is needed ({e})", allow_module_level=True)
try:
    import kv_faults
    from gdskit.kv import BlockStore
except ImportError as e:  # pragma: no cover
    pytest.skip(f"SKIP: cannot import gdskit.kv ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("kv_e2e", os.path.join(HERE, "..", "..", "scripts", "kv-e2e.py"))
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)


# ---- TEST STAND-IN of the transformers names the script uses ----------------------------------------------------

class _Layer:
    def __init__(self):
        self.keys = self.values = None


class DynamicCache:
    def __init__(self):
        self.layers = []

    def update(self, k, v, i):
        while len(self.layers) <= i:
            self.layers.append(_Layer())
        layer = self.layers[i]
        layer.keys = k if layer.keys is None else torch.cat([layer.keys, k], dim=-2)
        layer.values = v if layer.values is None else torch.cat([layer.values, v], dim=-2)
        return layer.keys, layer.values

    def get_seq_length(self):
        return 0 if not self.layers else self.layers[0].keys.shape[-2]


class LlamaConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Inner(torch.nn.Module):
    """Embedding, then per layer a causal attention over the cache and the new tokens (grouped K/V heads)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = torch.nn.Embedding(c.vocab_size, c.hidden_size)
        d = c.hidden_size // c.num_attention_heads
        self.q = torch.nn.ModuleList(torch.nn.Linear(c.hidden_size, c.hidden_size) for _ in range(c.num_hidden_layers))
        self.kv = torch.nn.ModuleList(torch.nn.Linear(c.hidden_size, 2 * c.num_key_value_heads * d)
                                      for _ in range(c.num_hidden_layers))
        self.head_dim = d

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        c, d = self.c, self.head_dim
        cache = past_key_values if past_key_values is not None else DynamicCache()
        x = self.embed(input_ids)
        s, past = x.shape[1], cache.get_seq_length()
        for i in range(c.num_hidden_layers):
            q = self.q[i](x).view(1, s, c.num_attention_heads, d).transpose(1, 2)
            k, v = self.kv[i](x).view(1, s, 2, c.num_key_value_heads, d).permute(2, 0, 3, 1, 4)
            k, v = cache.update(k, v, i)
            rep = c.num_attention_heads // c.num_key_value_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = (q @ k.transpose(-1, -2)) / d ** 0.5
            mask = torch.ones(s, past + s, dtype=torch.bool).tril(past)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + (att @ v).transpose(1, 2).reshape(1, s, -1)
        return types.SimpleNamespace(last_hidden_state=x, past_key_values=cache)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = _Inner(c)
        self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False)


fake_transformers = types.ModuleType("transformers")
fake_transformers.__version__ = "test-stand-in"
fake_transformers.LlamaConfig = LlamaConfig
fake_transformers.LlamaForCausalLM = LlamaForCausalLM
fake_transformers.DynamicCache = DynamicCache


# ---- tests ----------------------------------------------------------------------------------------------------------

def _layers(n=3, heads=2, seq=40, dim=8, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn((1, heads, seq, dim), generator=g).to(dtype) for _ in range(2)) for _ in range(n)]


def test_pack_and_unpack_are_inverse_and_blocks_hold_tokens_of_every_layer():
    for dtype in (torch.bfloat16, torch.float32):
        layers = _layers(dtype=dtype)
        packed = e2e.pack_blocks(torch, layers, 8)
        assert packed.dtype == torch.uint8
        assert tuple(packed.shape) == (5, e2e.block_bytes_of(3, 2, 8, torch.empty((), dtype=dtype).element_size(), 8))
        back = e2e.unpack_blocks(torch, packed, 3, 2, 8, dtype, 8)
        for (k, v), (k2, v2) in zip(layers, back):
            assert torch.equal(k, k2) and torch.equal(v, v2)
        # Block 2 starts with layer 0's K of tokens 16..23 and ends with the last layer's V of those tokens.
        part = 2 * 8 * 8 * torch.empty((), dtype=dtype).element_size()
        want_first = layers[0][0][0, :, 16:24].contiguous().view(torch.uint8).reshape(-1)
        want_last = layers[2][1][0, :, 16:24].contiguous().view(torch.uint8).reshape(-1)
        assert torch.equal(packed[2, :part], want_first) and torch.equal(packed[2, -part:], want_last)
    # A tail shorter than a block is left out.
    assert e2e.pack_blocks(torch, _layers(seq=43), 8).shape[0] == 5
    for bad in ([(torch.zeros(2, 2, 8, 8), torch.zeros(2, 2, 8, 8))],
                [(torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 4))]):
        try:
            e2e.pack_blocks(torch, bad, 8)
        except ValueError:
            pass
        else:
            raise AssertionError("a bad cache was packed")


def test_block_keys_name_the_whole_prefix():
    a = e2e.block_keys(list(range(64)), 16, "ns")
    assert len(a) == 4 and len(set(a)) == 4 and all(len(k) == 32 for k in a)
    b = e2e.block_keys(list(range(64)) + [1, 2, 3], 16, "ns")
    assert a == b
    c = e2e.block_keys([99] + list(range(1, 64)), 16, "ns")
    assert all(x != y for x, y in zip(a, c))
    assert e2e.block_keys(list(range(64)), 16, "other") != a


def test_cache_layers_reads_every_cache_layout():
    layers = _layers(n=2)
    c = DynamicCache()
    for i, (k, v) in enumerate(layers):
        c.update(k, v, i)
    old = types.SimpleNamespace(key_cache=[k for k, _ in layers], value_cache=[v for _, v in layers])
    for cache in (c, old, tuple(layers)):
        got = e2e.cache_layers(cache)
        assert all(x is k and y is v for (x, y), (k, v) in zip(got, layers))


def test_drop_tree_leaves_files_intact():
    tmp = kv_faults.fresh_folder("kv-e2e-")
    os.makedirs(os.path.join(tmp, "a", "b"))
    p = os.path.join(tmp, "a", "b", "f")
    with open(p, "wb") as f:
        f.write(b"x" * 10000)
    os.symlink("/nonexistent", os.path.join(tmp, "dangling"))
    e2e.drop_tree(tmp)
    with open(p, "rb") as f:
        assert f.read() == b"x" * 10000


def _tiny(*extra):
    tmp = kv_faults.fresh_folder("kv-e2e-")
    return tmp, e2e.parse(["--store", tmp, "--device", "cpu", "--tiny", *extra])


def test_layout_only_run_round_trips_the_cache():
    tmp, a = _tiny("--layout-only")
    lines = []
    rep = e2e.run(a, store_class=BlockStore, out=lines.append)
    assert rep["ok"] and rep["equal"] == {"store_cold": True, "torch_load_cold": True}, rep
    assert rep["model_skipped"] == "--layout-only" and rep["blocks"] == 16
    assert rep["store_stats"]["stored"] == 16 and rep["store_stats"]["hits"] == 16 * a.rounds
    assert any("model part skipped" in x for x in lines)
    assert os.listdir(tmp) == [], "the run's folder was left behind"


def test_model_run_continues_from_the_store_with_equal_logits():
    tmp, a = _tiny()
    saved = sys.modules.get("transformers")
    sys.modules["transformers"] = fake_transformers
    try:
        rep = e2e.run(a, store_class=BlockStore, out=lambda *_: None)
    finally:
        if saved is None:
            sys.modules.pop("transformers", None)
        else:
            sys.modules["transformers"] = saved
    assert rep["model"] and rep["transformers"] == "test-stand-in"
    assert rep["ok"] and rep["equal"] == {"store_cold": True, "torch_load_cold": True}, rep
    for name in ("recompute", "store_cold", "torch_load_cold"):
        assert len(rep[f"ttft_{name}_rounds_s"]) == a.rounds and rep[f"ttft_{name}_s"] > 0
    assert rep["recompute_max_abs_diff"] < 1e-3


def test_a_corrupted_block_fails_the_run():
    class Flipping(BlockStore):
        def get(self, keys, out):
            hits = super().get(keys, out)
            out[3, 100] ^= 1
            return hits

    tmp, a = _tiny("--layout-only")
    rep = e2e.run(a, store_class=Flipping, out=lambda *_: None)
    assert not rep["ok"] and rep["equal"]["store_cold"] is False and rep["equal"]["torch_load_cold"] is True


def test_arguments_are_checked():
    tmp = kv_faults.fresh_folder("kv-e2e-")
    for bad in (["--tokens", "100", "--block-tokens", "64"], ["--heads", "5"], ["--rounds", "0"]):
        try:
            e2e.parse(["--store", tmp, *bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{bad} accepted")
    assert e2e.main(["--store", os.path.join(tmp, "missing"), "--tiny"]) == 2


def test_main_without_a_store_in_the_build_skips():
    try:
        import gdskit.kv  # noqa: F401
        has_store = hasattr(sys.modules["gdskit.kv"], "BlockStore")
    except ImportError:
        has_store = False
    tmp = kv_faults.fresh_folder("kv-e2e-")
    os.environ["GDSKIT_E2E_NO_TRANSFORMERS"] = "1"
    try:
        code = e2e.main(["--store", tmp, "--device", "cpu", "--tiny"])
    finally:
        del os.environ["GDSKIT_E2E_NO_TRANSFORMERS"]
    assert code == (0 if has_store else 77), code
