#!/usr/bin/env python3
"""bwd_error_model.py - the error a FlashAttention-style 16-bit backward is expected to make, from an
emulation of its arithmetic on the host (torch, CPU): the numbers behind tests/gpu/test_bwd.cu's
tolerances.

    python3 bench/bwd_error_model.py [--seeds 1] [--dtypes bf16,fp16] [--quick]

Per shape (the test's, minus the longest), q, k, v, dO ~ N(0, 1) rounded to the dtype, then:
  exact     float64: P = softmax(scale q k^T [causal, bottom-right]), O = P V, D = rowsum(dO * O),
            dS = P (dP - D), dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q (GQA: summed per kv head)
  emulated  the forward in fp32 with P rounded to the dtype before P V and O rounded; the backward
            with P = exp(S - lse) from fp32 scores and the fp32 LSE, dP in fp32, D from the rounded
            O, P and dS rounded to the dtype before the three GEMMs (fp32 accumulation), dQ, dK, dV
            rounded at the end
Printed per tensor: the relative Frobenius error of the emulation against the exact gradient, the
same for the exact gradient merely rounded to the dtype (the floor), and max |g - g*| / rms(g*).
"""
import argparse
import math
import sys

SHAPES = [  # sq, sk, hq, hkv, d, causal, scale (None: 1/sqrt(d))
    (17, 17, 2, 2, 128, True, None), (64, 64, 4, 4, 64, False, None), (1000, 1000, 2, 2, 64, True, None),
    (1000, 1000, 2, 2, 128, False, None), (100, 1000, 4, 2, 128, True, None), (1000, 100, 4, 2, 128, True, None),
    (513, 513, 8, 2, 128, False, None), (333, 777, 8, 1, 64, True, None), (300, 500, 4, 2, 64, False, 0.3),
    (500, 500, 2, 2, 128, True, 0.2), (200, 200, 8, 1, 256, False, None), (1000, 1000, 2, 2, 256, True, None),
    (2048, 2048, 8, 2, 64, True, None), (4097, 4097, 1, 1, 64, True, None), (4097, 4097, 1, 1, 256, False, None),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1, help="inputs drawn this many times per shape")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--quick", action="store_true", help="shapes up to 1000 x 1000 only")
    a = ap.parse_args(argv)
    import torch
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    f64, f32 = torch.float64, torch.float32

    def rnd(x, dt):
        return x.to(dt).to(x.dtype)

    worst = {}
    for seed in range(a.seeds):
        for name in a.dtypes.split(","):
            dt = dts[name]
            for (sq, sk, hq, hkv, d, causal, scale) in SHAPES:
                if a.quick and sq * sk > 10 ** 6:
                    continue
                torch.manual_seed(1000 * seed + sq + sk + d)
                sc = scale or 1 / math.sqrt(d)
                q, do = (rnd(torch.randn(hq, sq, d, dtype=f64), dt) for _ in range(2))
                k, v = (rnd(torch.randn(hkv, sk, d, dtype=f64), dt) for _ in range(2))
                g = hq // hkv
                K, V = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
                mask = None
                if causal:
                    mask = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq

                def masked(s):
                    return s.masked_fill(mask, -math.inf) if mask is not None else s

                def per_kv(x):
                    return x.view(hkv, g, sk, d).sum(1)

                # exact
                p = torch.softmax(masked(q @ K.transpose(1, 2) * sc), -1).nan_to_num(0.0)
                o = p @ V
                ds = p * (do @ V.transpose(1, 2) - (do * o).sum(-1, keepdim=True))
                exact = (ds @ K * sc, per_kv(ds.transpose(1, 2) @ q * sc), per_kv(p.transpose(1, 2) @ do))
                # emulated
                s = masked((q.to(f32) @ K.to(f32).transpose(1, 2)) * sc)
                m = s.amax(-1, keepdim=True)
                m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
                e = torch.exp(s - m)
                l = e.sum(-1, keepdim=True)
                lse = m + torch.log(l)
                o16 = rnd(((rnd(e, dt) @ V.to(f32)) / l).nan_to_num(0.0), dt)
                p32 = torch.exp(s - lse).nan_to_num(0.0)
                ds32 = p32 * (do.to(f32) @ V.to(f32).transpose(1, 2) - (do.to(f32) * o16).sum(-1, keepdim=True))
                pb, dsb = rnd(p32, dt), rnd(ds32, dt)
                emu = (dsb @ K.to(f32) * sc, per_kv(dsb.transpose(1, 2) @ q.to(f32) * sc),
                       per_kv(pb.transpose(1, 2) @ do.to(f32)))
                cells = []
                for t, x, r in zip(("dq", "dk", "dv"), emu, exact):
                    x = rnd(x.double(), dt)
                    fro = ((x - r).norm() / r.norm()).item()
                    floor = ((rnd(r, dt) - r).norm() / r.norm()).item()
                    mx = (x - r).abs().max().item() / (r.norm().item() / math.sqrt(r.numel()))
                    w = worst.setdefault(name, [0.0, 0.0])
                    w[0], w[1] = max(w[0], fro), max(w[1], mx)
                    cells.append("%s %.2e (floor %.2e) max/rms %.3f" % (t, fro, floor, mx))
                print("%s sq%d sk%d h%d/%d d%d%s scale %.3g: %s" % (name, sq, sk, hq, hkv, d,
                      " causal" if causal else "", sc, " | ".join(cells)))
                sys.stdout.flush()
    for name, (fro, mx) in worst.items():
        print("%s worst: rel Frobenius %.2e, max |g - g*| / rms(g*) %.3f" % (name, fro, mx))
    return 0


if __name__ == "__main__":
    sys.exit(main())
