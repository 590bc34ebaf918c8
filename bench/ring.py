"""ring.py - fattn.parallel's ring attention on several GPUs over NCCL (issue 40): the correctness
run against the same attention on one GPU and against float64, and the scaling benchmark.

    python3 bench/ring.py --check [--gpus 2] [--tokens 131072]
    python3 bench/ring.py --scale [--gpus 1,2,4] [--tokens 32768,131072,524288] [--json out.json]
    python3 bench/ring.py --cpu-check       # both, tiny shapes, gloo and the CPU engine (CI-sized)

One process per GPU (torch.multiprocessing, NCCL; the environment's NCCL_NVLS_ENABLE=0 is kept).
bf16, head dim 128, GQA 32/8, batch 1.
--check: causal with the zigzag split and non-causal with the contiguous split, on one sequence
  of --tokens and on a varlen batch of three sequences (1/2, 3/8 and 1/8 of --tokens); every rank
  makes the same inputs (one seed), runs ring_attention(_varlen) forward and backward on its part,
  and rank 0 gathers out, dq, dk, dv, runs fattn on the whole sequence on its GPU, and compares
  both with float64 on a sample: kv heads 0 and the last (each with its whole query group, so
  that dK and dV are complete), 256 query rows (out, dq) and 256 key rows (dk, dv) drawn at
  random per sequence.  Pass: each max |ring - fp64| <= 2 x max |one GPU - fp64| + 1e-3 x
  max |fp64| (the ring merges blocks in float32 in another order: bf16 noise of the same size).
--scale: forward + backward of one causal sequence (zigzag) per token count and GPU count, CUDA
  events around --iters calls after --warmup, the median; 1 GPU is fattn's own forward + backward
  on the whole sequence.  Reports the time per token, the efficiency t(1) / (W t(W)), and the
  share of the ring's communication hidden under the kernels: (compute + comm - ring) / comm,
  compute being the same ring with its sends replaced by the local blocks (no traffic) and comm
  the same sends alone.  ring-flash-attn is timed beside it when importable (it needs the
  flash_attn package, which this machine's peers do not ship: then n/a).
Sizes that do not fit a GPU's memory are skipped with a line."""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import fattn  # noqa: E402
import fattn.parallel as fp  # noqa: E402

HQ, HKV, D = 32, 8, 128


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, cpu, fn, args, queue):
    if cpu:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if cpu else "nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    try:
        res = fn(rank, world, cpu, *args)
        if rank == 0:
            queue.put(res)
    finally:
        dist.destroy_process_group()


def spawn(fn, world, cpu, *args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_entry, args=(world, free_port(), cpu, fn, args, queue), nprocs=world, join=True)
    return queue.get()


def make_inputs(t, dev, seed, hq=HQ, hkv=HKV, d=D):
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.bfloat16)  # noqa: E731
    return r(t, hq, d), r(t, hkv, d), r(t, hkv, d), r(t, hq, d)


def gather_parts(x, world):
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return parts


# ---------------------------------------------------------------------------
# float64 on a sample: kv heads, their query groups, rows of one sequence
# ---------------------------------------------------------------------------

def fp64_sample(q, k, v, do, causal, qrows, krows, kv_heads, chunk=4096):
    """{name: tensor} of float64 out / dq at qrows and dk / dv at krows, for the query heads
    of kv_heads; q [t, hq, d] one sequence."""
    t, hq, d = q.shape
    grp, scale = hq // k.shape[1], d ** -0.5
    res = {n: [] for n in ("out", "dq", "dk", "dv")}
    for kh in kv_heads:
        K, V = k[:, kh].double(), v[:, kh].double()
        dk = torch.zeros(len(krows), d, dtype=torch.float64, device=q.device)
        dv = torch.zeros_like(dk)
        for h in range(kh * grp, (kh + 1) * grp):
            Q, dO = q[:, h].double(), do[:, h].double()
            lse = torch.empty(t, dtype=torch.float64, device=q.device)
            dsum = torch.empty_like(lse)
            for a in range(0, t, chunk):  # the LSE and rowsum(dO O) of every row
                s = Q[a:a + chunk] @ K.T * scale
                if causal:
                    s.masked_fill_(torch.arange(t, device=q.device)[None] > torch.arange(a, a + s.shape[0],
                                                                                         device=q.device)[:, None],
                                   float("-inf"))
                lse[a:a + chunk] = torch.logsumexp(s, 1)
                o = torch.softmax(s, 1) @ V
                dsum[a:a + chunk] = (o * dO[a:a + chunk]).sum(1)
            s = Q[qrows] @ K.T * scale
            if causal:
                s.masked_fill_(torch.arange(t, device=q.device)[None] > qrows[:, None], float("-inf"))
            p = torch.exp(s - lse[qrows, None])
            res["out"].append(p @ V)
            res["dq"].append((p * (dO[qrows] @ V.T - dsum[qrows, None])) @ K * scale)
            s = Q @ K[krows].T * scale  # [t, |krows|]
            if causal:
                s.masked_fill_(krows[None] > torch.arange(t, device=q.device)[:, None], float("-inf"))
            p = torch.exp(s - lse[:, None])
            dv += p.T @ dO
            dk += (p * (dO @ V[krows].T - dsum[:, None])).T @ Q * scale
        res["dk"].append(dk)
        res["dv"].append(dv)
    return {n: torch.stack(x) for n, x in res.items()}


def take(name, x, qrows, krows, kv_heads, grp):
    """The sample of fattn's [t, heads, d] result `name` matching fp64_sample's."""
    if name in ("out", "dq"):
        return torch.stack([x[qrows, h].double() for kh in kv_heads for h in range(kh * grp, (kh + 1) * grp)])
    return torch.stack([x[krows, kh].double() for kh in kv_heads])


# ---------------------------------------------------------------------------
# --check
# ---------------------------------------------------------------------------

def check_worker(rank, world, cpu, tokens, hq, hkv, d):
    dev = "cpu" if cpu else "cuda"
    lines, ok = [], True
    seqs = {"one sequence": [tokens], "varlen": [tokens // 2, tokens * 3 // 8, tokens // 8]}
    for what, lens in seqs.items():
        t = sum(lens)
        cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
        for causal in (True, False):
            q, k, v, do = make_inputs(t, dev, 7 + len(lens), hq, hkv, d)
            if causal:
                shard = lambda x: fp.zigzag_shard_varlen(x, cu, rank, world)  # noqa: E731
                unshard = lambda ps: fp.zigzag_unshard_varlen(ps, cu)  # noqa: E731
            else:
                shard = lambda x: torch.cat([fp.contiguous_shard(x[a:b], rank, world, 0)  # noqa: E731
                                             for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
                unshard = lambda ps: torch.cat([torch.cat([p[a // world:b // world] for p in ps])  # noqa: E731
                                                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
            ql, kl, vl = (shard(x).clone().requires_grad_() for x in (q, k, v))
            cu_l = (cu // world).to(ql.device)
            o = fp.ring_attention_varlen(ql, kl, vl, cu_l, max(lens) // world, causal=causal)
            o.backward(shard(do))
            got = {n: unshard(gather_parts(x.detach(), world)) for n, x in
                   (("out", o), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad))}
            if rank != 0:
                continue
            qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))
            cud = cu.to(q.device)
            oa = fattn.flash_attn_varlen_func(qa, ka, va, cud, cud, max(lens), max(lens), causal=causal)
            oa.backward(do)
            one = {"out": oa.detach(), "dq": qa.grad, "dk": ka.grad, "dv": va.grad}
            g = torch.Generator().manual_seed(3)
            worst = {}
            for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
                n = b - a
                qrows = torch.randint(0, n, (min(256, n),), generator=g).to(q.device)
                krows = torch.randint(0, n, (min(256, n),), generator=g).to(q.device)
                kvh = [0, hkv - 1]
                ref = fp64_sample(q[a:b], k[a:b], v[a:b], do[a:b], causal, qrows, krows, kvh)
                for name in ref:
                    er = (take(name, got[name][a:b], qrows, krows, kvh, hq // hkv) - ref[name]).abs().max().item()
                    eo = (take(name, one[name][a:b], qrows, krows, kvh, hq // hkv) - ref[name]).abs().max().item()
                    bound = 2.0 * eo + 1e-3 * ref[name].abs().max().item()
                    w = worst.get(name, (0.0, 0.0, True))
                    worst[name] = (max(w[0], er), max(w[1], eo), w[2] and er <= bound)
            for name, (er, eo, good) in worst.items():
                ok &= good
                lines.append("%-12s %-10s %-3s ring %.3e  one GPU %.3e  %s" % (
                    what, "causal" if causal else "non-causal", name, er, eo, "ok" if good else "FAILED"))
    return {"ok": ok, "lines": lines}


# ---------------------------------------------------------------------------
# --scale
# ---------------------------------------------------------------------------

def timed(fn, warmup, iters, cpu):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if cpu:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        else:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
    return statistics.median(out)


def scale_worker(rank, world, cpu, tokens, warmup, iters, hq, hkv, d):
    dev = "cpu" if cpu else "cuda"
    q, k, v, do = make_inputs(tokens // world, dev, 11 + rank, hq, hkv, d)
    q, k, v, do = (x[None] for x in (q, k, v, do))
    ql, kl, vl = (x.clone().requires_grad_() for x in (q, k, v))

    def ring():
        o = fp.ring_attention(ql, kl, vl, causal=True)
        o.backward(do)

    res = {"ring": timed(ring, warmup, iters, cpu)}
    start = fp._Ring.start
    try:  # the same ring without traffic: each step's block is the local one
        fp._Ring.start = lambda self, tensors, tag: ([], list(tensors))
        res["compute"] = timed(ring, warmup, iters, cpu)
    finally:
        fp._Ring.start = start
    ring_ = fp._Ring(None)

    def comm():  # the ring's sends alone: K, V forward; K, V, dK, dV backward; W - 1 steps each
        for tensors in ((kl, vl), (kl, vl, kl, vl)):
            for _ in range(world - 1):
                fp._Ring.wait(ring_.start([t.detach() for t in tensors], 0))

    res["comm"] = timed(comm, warmup, iters, cpu)
    try:
        from ring_flash_attn import zigzag_ring_flash_attn_func as rfa

        def peer():
            o = rfa(ql, kl, vl, causal=True)
            o.backward(do)
        res["ring-flash-attn"] = timed(peer, warmup, iters, cpu)
    except Exception as e:  # not installed, or its flash_attn dependency missing
        res["ring-flash-attn"] = "n/a (%s)" % str(e).splitlines()[0][:80]
    return res


def one_gpu(tokens, warmup, iters, cpu, hq, hkv, d):
    dev = "cpu" if cpu else "cuda"
    q, k, v, do = (x[None] for x in make_inputs(tokens, dev, 11, hq, hkv, d))
    qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))

    def run():
        fattn.flash_attn_func(qa, ka, va, causal=True).backward(do)
    if not cpu:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
    try:
        return timed(run, warmup, iters, cpu)
    finally:
        if not cpu:
            dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument("--gpus", default=None)
    ap.add_argument("--tokens", default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    cpu = a.cpu_check
    shape = (4, 2, 32) if cpu else (HQ, HKV, D)
    if cpu:
        a.check = a.scale = True
    if not (a.check or a.scale):
        ap.error("give --check, --scale or --cpu-check")
    avail = 4 if cpu else torch.cuda.device_count()
    out, failed = {}, False
    print("ring attention: %s, torch %s, fattn %s, %d %s" % (
        "CPU (gloo)" if cpu else torch.cuda.get_device_name(), torch.__version__, fattn.__version__, avail,
        "processes" if cpu else "GPUs"))
    if a.check:
        world = int(a.gpus or 2)
        tokens = int(a.tokens or (64 if cpu else 131072))
        if world > avail:
            print("--check: %d GPUs asked, %d here: not run" % (world, avail))
            failed = True
        else:
            r = spawn(check_worker, world, cpu, tokens, *shape)
            print("check: %d ranks, %d tokens, bf16 d%d GQA %d/%d" % (world, tokens, shape[2], shape[0], shape[1]))
            for line in r["lines"]:
                print("  " + line)
            print("check: %s" % ("passed" if r["ok"] else "FAILED"))
            failed |= not r["ok"]
            out["check"] = dict(r, world=world, tokens=tokens)
    if a.scale:
        worlds = [int(x) for x in (a.gpus or ("1,2" if cpu else "1,2,4")).split(",")]
        toks = [int(x) for x in (a.tokens or ("128" if cpu else "32768,131072,524288")).split(",")]
        rows = []
        for t in toks:
            base = None
            for w in worlds:
                if w > avail:
                    print("  %7d tokens, %d GPUs: not run (%d here)" % (t, w, avail))
                    continue
                try:
                    if w == 1:
                        r = {"ring": one_gpu(t, a.warmup, a.iters, cpu, *shape)}
                        base = r["ring"]
                    else:
                        r = spawn(scale_worker, w, cpu, t, a.warmup, a.iters, *shape)
                except torch.cuda.OutOfMemoryError:
                    print("  %7d tokens, %d GPUs: out of memory, skipped" % (t, w))
                    continue
                eff = base / (w * r["ring"]) if base else None
                hid = (r["compute"] + r["comm"] - r["ring"]) / r["comm"] if "comm" in r and r["comm"] > 0 else None
                print("  %7d tokens, %d GPU%s: %9.2f ms fwd+bwd, %7.3f us/token%s%s%s" % (
                    t, w, "s" if w > 1 else " ", r["ring"], r["ring"] * 1e3 / t,
                    "" if eff is None else ", efficiency %.2f" % eff,
                    "" if hid is None else ", comm %.2f ms, %.0f%% hidden" % (r["comm"], 100 * hid),
                    "" if "ring-flash-attn" not in r else ", ring-flash-attn %s" % (
                        "%.2f ms" % r["ring-flash-attn"] if isinstance(r["ring-flash-attn"], float)
                        else r["ring-flash-attn"])))
                rows.append(dict(r, tokens=t, gpus=w, efficiency=eff, hidden=hid))
        out["scale"] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
