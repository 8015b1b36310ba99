#!/usr/bin/env python3
"""Multi-process tests of gdskit's distributed load and save over torch.distributed (gloo, CPU tensors).

    PYTHONPATH=<build>/python /usr/bin/python3 -m pytest python/tests/test_distributed.py [-k name]
Each case starts `world` worker processes of this file (--worker), joined through a file:// store, with timeouts
on the process group and here, so a hang fails the case instead of the run. The cases skip, with the reason,
when torch or gloo is missing.
"""
import datetime
import errno
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

CASE_TIMEOUT_S = 120
PG_TIMEOUT_S = 30


def _skip_reason():
    try:
        import gdskit  # noqa: F401
    except ImportError as e:
        return f"cannot import gdskit ({e}); build with -DGDSKIT_BUILD_PYTHON=ON and set PYTHONPATH"
    try:
        import torch.distributed as dist
    except ImportError as e:
        return f"torch is not installed ({e})"
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with gloo is not available in this torch build"
    return None


@pytest.fixture(autouse=True)
def _needs_torch_and_gloo():
    why = _skip_reason()
    if why:
        pytest.skip(why)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint

def _bytes(n, seed):
    import random
    return random.Random(seed).randbytes(n)


_SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "U8": 1, "F8_E4M3": 1, "I32": 4}


def model_tensors():
    """A small Llama-shaped checkpoint: uneven splits, row-parallel tensors with small and with large rows,
    scalars, an empty tensor and 8-bit floats."""
    specs = [
        ("model.embed_tokens.weight", "F32", (37, 16)),
        ("model.layers.0.input_layernorm.weight", "F32", (16,)),
        ("model.layers.0.self_attn.q_proj.weight", "BF16", (30, 16)),
        ("model.layers.0.self_attn.q_proj.bias", "BF16", (30,)),
        ("model.layers.0.self_attn.o_proj.weight", "F32", (16, 30)),
        ("model.layers.0.self_attn.o_proj.bias", "F32", (16,)),
        ("model.layers.0.mlp.down_proj.weight", "F32", (3, 200003)),  # rows of 800 KB: split rows read directly
        ("model.layers.0.mlp.up_proj.weight", "F8_E4M3", (41, 8)),
        ("model.layers.1.post_attention_layernorm.weight", "F16", (16,)),
        ("model.layers.1.mlp.gate_proj.weight", "BF16", (65, 1000)),
        ("model.layers.1.mlp.down_proj.weight", "BF16", (1000, 65)),
        ("model.layers.1.rotary.inv_freq", "F32", (0, 3)),
        ("model.step", "I64", ()),
        ("model.norm.weight", "F32", (16,)),
        ("lm_head.weight", "BF16", (37, 16)),
    ]
    out = []
    for i, (name, dtype, shape) in enumerate(specs):
        n = _SIZES[dtype]
        for s in shape:
            n *= s
        out.append((name, dtype, shape, _bytes(n, i)))
    return out


def write_checkpoint(folder):
    """Two shards and an index; returns the index path and the bytes of tensor data."""
    os.makedirs(folder, exist_ok=True)
    ts = model_tensors()
    shards = [ts[:7], ts[7:]]
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        from test_gdskit import write_st  # noqa: PLC0415  (the one safetensors writer of the tests)
        write_st(os.path.join(folder, fname), {name: (dtype, shape, raw) for name, dtype, shape, raw in part})
        for name, *_ in part:
            weight_map[name] = fname
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return index, sum(len(raw) for *_, raw in ts)


# ---------------------------------------------------------------------------------------------------------------
# Worker side

def _as_bytes(torch, x):
    x = x.contiguous()
    return bytes(x.reshape(-1).view(torch.uint8).numpy()) if x.numel() else b""


def _expected(torch, full, spec, rank, tp):
    """What `rank` must get of a tensor under a placement spec, sliced by torch itself."""
    if spec is None:
        return None
    if spec == "replicated":
        return full
    if isinstance(spec, tuple):
        dim = spec[1]
        if dim >= full.dim():
            return full
        tp_rank, tp_world = tp
        return torch.tensor_split(full, tp_world, dim=dim)[tp_rank]
    v = spec.get(rank)
    if v is None:
        return None
    if v == "full":
        return full
    _, dim, k, n = v
    return full if dim >= full.dim() else torch.tensor_split(full, n, dim=dim)[k]


def _placement(kind, world):
    import gdskit.distributed as gd
    if kind == "llama":
        return gd.llama_tp
    if kind == "replicated":
        return None
    if kind == "explicit":
        # Expert/pipeline style: layer 0 lives on rank 0 (whole), layer 1 on the last rank split in two
        # halves along dim 0 for ranks 0 and the last, the rest replicated.
        def rule(name, shape, dtype):
            if ".layers.0." in name:
                return {0: "full"}
            if ".layers.1." in name:
                return {0: ("split", 0, 0, 2), world - 1: ("split", 0, 1, 2)}
            if name == "model.step":
                return None
            return "replicated"
        return rule
    if kind == "fail-on-1":
        import torch.distributed as dist

        def rule(name, shape, dtype):
            if dist.get_rank() == 1 and name == "lm_head.weight":
                raise ValueError("this rank cannot place lm_head")
            return "replicated"
        return rule
    raise ValueError(kind)


def init_group(args):
    """Joins the gloo job spawn() started; returns (rank, world)."""
    import torch.distributed as dist
    rank, world = args["rank"], args["world"]
    dist.init_process_group("gloo", init_method="file://" + args["store"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    return rank, world


def worker(args):
    """Runs the cases one after another in one process group (a failed case must leave it usable)."""
    import torch.distributed as dist
    rank, world = init_group(args)
    results = [run_one(rank, world, case) for case in args["cases"]]
    with open(args["out"], "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _holdings(names, world, mode, rank):
    """The names `rank` holds: all, round-robin, or 1-D tensors replicated and the rest round-robin."""
    if mode == "replicated":
        return list(names)
    return [n for i, (n, nd) in enumerate(names.items()) if i % world == rank or (mode == "mixed" and nd <= 1)]


def run_save(rank, world, args):
    """One rank of a distributed save, checked on rank 0 against the single-process save of the union."""
    import torch
    import torch.distributed as dist
    import gdskit
    result = {"rank": rank}
    full = gdskit.load_safetensors(args["reference"], device="cpu")
    dims = {n: t.dim() for n, t in full.items()}
    mine = {n: full[n] for n in _holdings(dims, world, args["save"], rank)}
    if args.get("bad_on") == rank:
        mine["zz.unwritable"] = torch.zeros(3, dtype=torch.complex128)  # no safetensors dtype: the save fails
    # Node-local folders (one per rank) and per-rank limits break the save's preconditions on purpose.
    out = os.path.join(args["folder"], f"saved-{rank}" if args.get("own_folder") else "saved")
    limit = args["limit"][rank] if isinstance(args["limit"], list) else args["limit"]
    try:
        written = gdskit.save_sharded(mine, out, max_shard_size=limit, group=dist.group.WORLD)
        stats = gdskit.distributed.last_stats()
        result.update(ok=True, written=[os.path.basename(w) for w in written], stats=stats)
        dist.barrier()
        if rank == 0:
            order = []
            for r in range(world):
                order += [n for n in _holdings(dims, world, args["save"], r) if n not in order]
            ref = os.path.join(args["folder"], "single")
            ref_written = gdskit.save_sharded({n: full[n] for n in order}, ref, max_shard_size=args["limit"])
            bad = []
            if [os.path.basename(w) for w in ref_written] != result["written"]:
                bad.append(f"files {result['written']} != {ref_written}")
            for w in ref_written:
                with open(w, "rb") as a, open(os.path.join(out, os.path.basename(w)), "rb") as b:
                    if a.read() != b.read():
                        bad.append(f"{os.path.basename(w)} differs from the single-process save")
            back = gdskit.load_safetensors(out, device="cpu")
            if set(back) != set(full) or any(not torch.equal(back[n].view(-1).view(torch.uint8) if back[n].numel()
                                                             else back[n], full[n].view(-1).view(torch.uint8)
                                                             if full[n].numel() else full[n]) for n in full):
                bad.append("the saved checkpoint does not load back")
            result.update(ok=not bad, bad=bad)
    except Exception as e:  # noqa: BLE001
        result.update(ok=False, error=f"{type(e).__name__}: {e}", errno=getattr(e, "errno", None))
        dist.barrier()  # every rank has cleaned up
        result["left"] = sorted(os.listdir(out)) if os.path.isdir(out) else []
    return result


def run_one(rank, world, args):
    import torch
    import torch.distributed as dist
    import gdskit
    if args.get("save"):
        return run_save(rank, world, args)
    result = {"rank": rank}
    try:
        placement = _placement(args["placement"], world)
        tp = args.get("tp")
        tp_args = {} if tp is None else {"tp_rank": tp[rank][0], "tp_world": tp[rank][1]}
        if args.get("env_node"):
            os.environ["GDSKIT_NODE"] = args["nodes"][rank]
            node_args = {}
        else:
            node_args = {"node": args["nodes"][rank]}
        path = args["paths"][rank]
        got = gdskit.load_safetensors(path, "cpu", group=dist.group.WORLD, placement=placement,
                                      timeout=datetime.timedelta(seconds=PG_TIMEOUT_S), **tp_args, **node_args)
        stats = gdskit.last_stats()
        ref = gdskit.load_safetensors(args["reference"], device="cpu")
        rule = placement if callable(placement) else (lambda n, s, d: placement or
                                                      (("split", 0) if tp else "replicated"))
        bad = []
        expected_names = []
        for name, full in ref.items():
            exp = _expected(torch, full, rule(name, list(full.shape), ""), rank, None if tp is None else tp[rank])
            if exp is None:
                continue
            expected_names.append(name)
            if name not in got:
                bad.append(f"{name} missing")
                continue
            g = got[name]
            if tuple(g.shape) != tuple(exp.shape) or g.dtype != exp.dtype:
                bad.append(f"{name}: {tuple(g.shape)} {g.dtype} != {tuple(exp.shape)} {exp.dtype}")
            elif _as_bytes(torch, g) != _as_bytes(torch, exp):
                bad.append(f"{name}: bytes differ")
        extra = sorted(set(got) - set(expected_names))
        if extra:
            bad.append(f"unexpected tensors {extra}")
        if list(got) != expected_names:
            bad.append("tensors are not in file order")
        result.update(ok=not bad, bad=bad, stats={k: v for k, v in stats.items()})
    except Exception as e:  # noqa: BLE001
        result.update(ok=False, error=f"{type(e).__name__}: {e}", errno=getattr(e, "errno", None))
    return result


# ---------------------------------------------------------------------------------------------------------------
# Harness

def case(world, placement, *, nodes=None, tp=None, paths=None, env_node=False, folder):
    """One load for the workers of a world size to run."""
    index = os.path.join(folder, "ckpt", "model.safetensors.index.json")
    return {"placement": placement, "tp": tp, "nodes": nodes or ["n0"] * world, "paths": paths or [index] * world,
            "reference": index, "env_node": env_node}


def run_cases(world, cases, folder):
    """Starts `world` workers running `cases`; returns per case the ranks' results. Fails on a hang or a crash."""
    write_checkpoint(os.path.join(folder, "ckpt"))
    results = spawn(__file__, world, {"cases": cases}, folder)
    return [[results[r][c] for r in range(world)] for c in range(len(cases))]


def spawn(script, world, payload, folder, timeout_s=CASE_TIMEOUT_S):
    """Runs `script --worker ARGS` as ranks 0..world-1 of a gloo job (file:// store in `folder`); each worker
    writes its JSON result to ARGS["out"]. Returns the results in rank order; fails on a hang or a crash."""
    store = os.path.join(folder, f"store-{time.monotonic_ns()}")
    procs, outs = [], []
    for r in range(world):
        out = os.path.join(folder, f"out-{r}-{time.monotonic_ns()}.json")
        args = dict(payload, rank=r, world=world, store=store, out=out)
        procs.append(subprocess.Popen([sys.executable, script, "--worker", json.dumps(args)]))
        outs.append(out)
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raise AssertionError(f"world {world}: a worker hung past {timeout_s} s")
    results = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        if not os.path.exists(out):
            raise AssertionError(f"rank {r} exited {p.returncode} without a result")
        if p.returncode != 0:  # the result is in, but the process did not exit cleanly: say so
            print(f"WARN: rank {r} of {world} exited {p.returncode} after writing its result", flush=True)
        with open(out) as f:
            results.append(json.load(f))
    return results


def _check_ok(results):
    for res in results:
        assert res.get("ok"), f"rank {res['rank']}: {res.get('error') or res.get('bad')}"


def _check_storage(results, nodes, data_bytes_per_node):
    """Per node: the ranks' read ranges are disjoint, each rank's reads are exactly its planned ranges, and the
    node reads the bytes it needs once."""
    by_node = {}
    for res, node in zip(results, nodes):
        st = res["stats"]
        assert st["node"] == node, (st["node"], node)
        ranges = [tuple(x) for x in st["read_ranges"]]
        assert st["bytes_read"] == sum(z - a for _, a, z in ranges), (res["rank"], st["bytes_read"])
        by_node.setdefault(node, []).append((res["rank"], ranges, st["bytes_read"]))
    for node, ranks in by_node.items():
        seen = []
        for r, ranges, _ in ranks:
            for f, a, z in ranges:
                seen.append((os.path.basename(f), a, z, r))
        seen.sort()
        for (f1, a1, z1, r1), (f2, a2, z2, r2) in zip(seen, seen[1:]):
            assert f1 != f2 or z1 <= a2, f"node {node}: ranks {r1} and {r2} both read {f1} [{a2}, {min(z1, z2)})"
        total = sum(b for _, _, b in ranks)
        assert total == data_bytes_per_node[node], (node, total, data_bytes_per_node[node])


def _data_bytes():
    return sum(len(raw) for *_, raw in model_tensors())


def _traffic_balanced(results):
    sent = sum(r["stats"]["bytes_sent"] for r in results)
    received = sum(r["stats"]["bytes_received"] for r in results)
    return sent, received


def _broken_copy(folder):
    """A copy of the checkpoint without its second shard; returns its index path."""
    src = os.path.join(folder, "ckpt")
    broken = os.path.join(folder, "broken")
    os.makedirs(broken, exist_ok=True)
    for f in os.listdir(src):
        if "00002" not in f:
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(broken, f), "wb") as b:
                b.write(a.read())
    return os.path.join(broken, "model.safetensors.index.json")


def _check_llama(res, world):
    _check_ok(res)
    _check_storage(res, ["n0"] * world, {"n0": _data_bytes()})
    if world == 1:
        assert res[0]["stats"]["bytes_sent"] == res[0]["stats"]["bytes_received"] == 0


def _check_missing_shard(res, failing):
    # Rank `failing` sees a copy of the checkpoint without its second shard: every rank raises, none hangs.
    for r in res:
        assert not r.get("ok"), r
        assert r["errno"] == 2, r  # ENOENT on every rank, from one rank's failure
    assert f"rank {failing} failed" in res[0]["error"], res[0]["error"]


def save_case(mode, folder, name, limit=150_000, bad_on=None):
    index = os.path.join(folder, "ckpt", "model.safetensors.index.json")
    sub = os.path.join(folder, name)
    os.makedirs(sub, exist_ok=True)
    return {"save": mode, "reference": index, "folder": sub, "limit": limit, "bad_on": bad_on}


def _check_same_error(res, code, *words):
    """Every rank raised, with the same errno and the same message, naming `words`."""
    for r in res:
        assert not r.get("ok"), r
        assert r["errno"] == code, r
        assert r["error"] == res[0]["error"], (r["error"], res[0]["error"])
    for w in words:
        assert w in res[0]["error"], (w, res[0]["error"])


def _check_save(res, world):
    _check_ok(res)
    written = res[0]["written"]
    assert len(written) > 2 and written[-1] == "model.safetensors.index.json", written
    assert all(r["written"] == written for r in res)
    files = [r["stats"]["files_written"] for r in res]
    assert sum(files) == len(written) - 1, files
    if world > 1:
        assert max(files) < len(written) - 1, files  # the files are shared out, not all on one rank


def test_save_world_1_to_4():
    for world in (1, 2, 3, 4):
        with tempfile.TemporaryDirectory() as d:
            write_checkpoint(os.path.join(d, "ckpt"))
            cases = [save_case(m, d, m) for m in ("replicated", "disjoint", "mixed")]
            if world == 3:
                cases.append(save_case("mixed", d, "failing", bad_on=1))
            results = run_cases(world, cases, d)
            for res in results[:3]:
                _check_save(res, world)
            if world == 3:
                # Rank 1 cannot write a tensor: every rank raises, no index is published, no shard is left.
                for r in results[3]:
                    assert not r.get("ok"), r
                    assert r["left"] == [], r["left"]
                assert "rank 1 failed" in results[3][0]["error"], results[3][0]


def test_save_refuses_an_existing_index():
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(os.path.join(d, "ckpt"))
        c = save_case("replicated", d, "exists")
        os.makedirs(os.path.join(c["folder"], "saved"))
        open(os.path.join(c["folder"], "saved", "model.safetensors.index.json"), "w").close()
        (res,) = run_cases(2, [c], d)
        for r in res:
            assert not r.get("ok") and r["errno"] == 17, r  # EEXIST on every rank, from rank 0's check
        assert res[0]["left"] == ["model.safetensors.index.json"], res[0]["left"]


def test_save_preconditions_fail_every_rank_alike():
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(os.path.join(d, "ckpt"))
        local = save_case("replicated", d, "local")
        local["own_folder"] = True  # each rank writes to a folder of its own, as node-local disks would be
        limits = save_case("replicated", d, "limits", limit=[150_000, 200_000])
        after = save_case("disjoint", d, "after")
        res_local, res_limits, res_after = run_cases(2, [local, limits, after], d)
        # Every rank learns that rank 1 does not see rank 0's folder; no rank writes a shard or an index.
        _check_same_error(res_local, errno.EINVAL, "rank 1", "shared folder")
        for r in range(2):
            folder = os.path.join(local["folder"], f"saved-{r}")
            assert not os.path.isdir(folder) or os.listdir(folder) == [], os.listdir(folder)
        _check_same_error(res_limits, errno.EINVAL, "max_shard_size")
        assert not os.path.exists(os.path.join(limits["folder"], "saved")) or \
            os.listdir(os.path.join(limits["folder"], "saved")) == []
        # The group is still usable.
        _check_save(res_after, 2)


def _altered_copy(folder):
    """A copy of the checkpoint whose second shard has the same name and tensor names, but one tensor stored
    as another dtype of the same size (F16 for BF16); returns its index path."""
    from test_gdskit import write_st  # noqa: PLC0415
    src = os.path.join(folder, "ckpt")
    alt = os.path.join(folder, "altered")
    os.makedirs(alt, exist_ok=True)
    ts = model_tensors()
    for f in os.listdir(src):
        if not f.startswith("model-00002-of"):
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(alt, f), "wb") as b:
                b.write(a.read())
    part = {name: ("F16" if dtype == "BF16" else dtype, shape, raw) for name, dtype, shape, raw in ts[7:]}
    write_st(os.path.join(alt, "model-00002-of-00002.safetensors"), part)
    return os.path.join(alt, "model.safetensors.index.json")


def test_load_refuses_ranks_that_see_different_files():
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(os.path.join(d, "ckpt"))
        altered = _altered_copy(d)
        index = os.path.join(d, "ckpt", "model.safetensors.index.json")
        broken = _broken_copy(d)
        other, same_node, missing_file, after = run_cases(2, [
            case(2, "replicated", paths=[index, altered], nodes=["a", "b"], folder=d),
            case(2, "llama", tp=[[0, 2], [1, 2]], paths=[index, altered], folder=d),
            # A folder whose index names a shard that is missing on rank 1: every rank raises ENOENT.
            case(2, "replicated", paths=[index, broken], nodes=["a", "b"], folder=d),
            case(2, "replicated", folder=d)], d)
        for res in (other, same_node):
            _check_same_error(res, errno.EINVAL, "model-00002-of-00002.safetensors", "rank 1")
            for r in res:
                assert "stats" not in r, r  # nothing was loaded
        _check_missing_shard(missing_file, 1)
        _check_ok(after)


def test_checkpoint_differences_are_named():
    from gdskit.distributed import _same_checkpoint  # noqa: PLC0415  (pure: what every rank computes alike)
    a = [("model-00001-of-00002.safetensors", 100, "h1"), ("model-00002-of-00002.safetensors", 200, "h2")]
    cases = [
        ([a, a[:1]], "file 2 is 'model-00002-of-00002.safetensors' of 2 on rank 0 and nothing of 1 on rank 1"),
        ([a, a, [a[0], ("other.safetensors", 200, "h2")]], "file 2 is 'model-00002-of-00002.safetensors' of 2 on "
                                                            "rank 0 and 'other.safetensors' of 2 on rank 2"),
        ([a, [a[0], (a[1][0], 199, "h2")]], "'model-00002-of-00002.safetensors' is 200 bytes on rank 0 and 199 on "
                                             "rank 1"),
        ([a, [(a[0][0], 100, "h9"), a[1]]], "the header of 'model-00001-of-00002.safetensors' differs between rank 0 "
                                             "and rank 1"),
    ]
    for identities, words in cases:
        try:
            _same_checkpoint(identities, ["p"] * len(identities))
            raise AssertionError(f"{identities} passed")
        except OSError as e:
            assert e.errno == errno.EINVAL and words in str(e), str(e)
    try:
        _same_checkpoint([a, a], ["p", "q"])
        raise AssertionError("different plans passed")
    except OSError as e:
        assert "rank 0 and rank 1 planned different loads" in str(e), str(e)
    _same_checkpoint([a, a, a], ["p", "p", "p"])


def test_world_1_and_2():
    with tempfile.TemporaryDirectory() as d:
        (one,) = run_cases(1, [case(1, "llama", tp=[[0, 1]], folder=d)], d)
        _check_llama(one, 1)
    with tempfile.TemporaryDirectory() as d:
        tp2, fail, after = run_cases(2, [case(2, "llama", tp=[[0, 2], [1, 2]], folder=d),
                                         case(2, "fail-on-1", folder=d),
                                         case(2, "replicated", folder=d)], d)
        _check_llama(tp2, 2)
        # Rank 1's placement raises part-way through planning: every rank raises, none hangs.
        for r in fail:
            assert not r.get("ok"), r
        assert "cannot place lm_head" in fail[1]["error"], fail[1]
        assert "rank 1 failed" in fail[0]["error"], fail[0]
        # ... and the group still works for the next load.
        _check_ok(after)
        _check_storage(after, ["n0"] * 2, {"n0": _data_bytes()})


def test_world_3():
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(os.path.join(d, "ckpt"))
        broken = _broken_copy(d)
        index = os.path.join(d, "ckpt", "model.safetensors.index.json")
        tp3, explicit, missing = run_cases(3, [
            case(3, "llama", tp=[[r, 3] for r in range(3)], folder=d),
            case(3, "explicit", folder=d),
            case(3, "replicated", paths=[index, index, broken], nodes=["a", "b", "c"], folder=d)], d)
        _check_llama(tp3, 3)
        _check_ok(explicit)
        step = [raw for name, *_, raw in model_tensors() if name == "model.step"][0]
        # Rank 1 needs neither layer; "model.step" is loaded by no rank.
        _check_storage(explicit, ["n0"] * 3, {"n0": _data_bytes() - len(step)})
        _check_missing_shard(missing, 2)


def test_world_4():
    with tempfile.TemporaryDirectory() as d:
        nodes = ["a", "a", "b", "b"]
        tp4, two_nodes, dp = run_cases(4, [
            case(4, "llama", tp=[[r, 4] for r in range(4)], folder=d),
            # 2 simulated nodes ($GDSKIT_NODE): every node reads the checkpoint once, every rank gets all of it.
            case(4, "replicated", nodes=nodes, env_node=True, folder=d),
            # 2 data-parallel replicas of tp 2 on one node: each slice is read once and sent to its twin.
            case(4, "llama", tp=[[0, 2], [1, 2], [0, 2], [1, 2]], folder=d)], d)
        _check_llama(tp4, 4)
        _check_ok(two_nodes)
        _check_storage(two_nodes, nodes, {"a": _data_bytes(), "b": _data_bytes()})
        for r in two_nodes:  # each rank reads part and receives the rest from the other rank of its node
            st = r["stats"]
            assert 0 < st["bytes_read"] < _data_bytes(), st["bytes_read"]
            # What came over the group is the other rank's share, plus the alignment padding of its allocation.
            received = st["bytes_received"]
            assert _data_bytes() <= st["bytes_read"] + received <= _data_bytes() + 4096 * st["broadcasts"], st
        _check_ok(dp)
        _check_storage(dp, ["n0"] * 4, {"n0": _data_bytes()})
        sent, received = _traffic_balanced(dp)
        assert sent > 0 and received > 0


def main(argv, worker_fn=None):
    """The entry of the worker processes spawn() starts (`FILE --worker ARGS`), for this file and test_dcp.py;
    the tests themselves run under pytest."""
    if len(argv) == 3 and argv[1] == "--worker":
        (worker_fn or worker)(json.loads(argv[2]))
        return 0
    print(f"usage: {argv[0]} --worker ARGS (started by the tests; run them with pytest)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
