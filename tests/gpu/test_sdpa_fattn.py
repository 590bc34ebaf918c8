#!/usr/bin/env python3
"""fattn behind torch's SDPA on a Hopper GPU (issue 39 item 1): after
fattn.sdpa.enable(), F.scaled_dot_product_attention with the flash backend runs
fattn's kernels (a profiler trace names fwd_sm90 / bwd_sm90 kernels), and its
outputs and gradients match torch's cuDNN backend; torch.nn.attention.varlen's
varlen_attn too; disable() gives torch's kernels back.  bf16 and fp16, causal and
not, GQA.  Exit 77 (skipped) without torch >= 2.9 or a Hopper GPU;
FATTN_REQUIRE_GPU=1 turns the missing GPU into a failure."""
import os
import sys


def skip(why, gpu):
    if gpu and os.environ.get("FATTN_REQUIRE_GPU", "0") not in ("", "0"):
        print("FAIL: FATTN_REQUIRE_GPU is set, and this test would skip: %s" % why)
        sys.exit(1)
    print("SKIP: %s" % why)
    sys.exit(77)


try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:
    skip("torch not installed (%s)" % e, gpu=False)
if not hasattr(torch.nn.attention, "register_flash_attention_impl"):
    skip("torch %s has no flash-attention registry (torch >= 2.9)" % torch.__version__, gpu=False)
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    skip("no Hopper GPU (torch.cuda.is_available() = %s)" % torch.cuda.is_available(), gpu=True)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import fattn.sdpa  # noqa: E402

failures = []


def check(name, got, want, tol):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    ok = err <= tol * max(scale, 1.0)
    print("%-48s max |diff| %.3e (scale %.2e) %s" % (name, err, scale, "ok" if ok else "FAIL"))
    if not ok:
        failures.append(name)


def run(backend, q, k, v, do, causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type.name == "CUDA"}


torch.manual_seed(0)
fattn.sdpa.enable()
for dtype in (torch.bfloat16, torch.float16):
    for causal in (False, True):
        for hq, hkv, d in ((8, 8, 128), (8, 2, 64), (4, 4, 256)):
            b, s = 2, 1000
            q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=dtype) for _ in range(2))
            do = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
            names = kernels(lambda: run(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal))
            tag = "%s causal=%d h %d/%d d %d" % (str(dtype)[6:], causal, hq, hkv, d)
            ran = sorted(n for n in names if "sm90" in n)
            print("%s: fattn kernels %s" % (tag, ran[:3]))
            if not any("fwd_sm90" in n for n in ran) or not any("bwd_sm90" in n for n in ran):
                failures.append(tag + ": no fattn kernel in the trace (%s)" % sorted(names)[:6])
            got = run(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal)
            want = run(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal)
            for n, g, w in zip(("out", "dq", "dk", "dv"), got, want):
                check("%s %s vs cuDNN" % (tag, n), g, w, 2e-2)

# torch.nn.attention.varlen.varlen_attn goes through aten::_flash_attention_forward
try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None
if varlen_attn is not None:
    cu = torch.tensor([0, 100, 612, 1000], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(1000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    import inspect
    causal_kw = {"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters \
        else {"window_size": (-1, 0)}
    names = kernels(lambda: varlen_attn(q, k, v, cu, cu, 512, 512, **causal_kw))
    if not any("fwd_sm90" in n for n in names):
        failures.append("varlen_attn: no fattn kernel in the trace")
    o = varlen_attn(q, k, v, cu, cu, 512, 512, **causal_kw)
    for a, z in ((0, 100), (100, 612), (612, 1000)):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            w = F.scaled_dot_product_attention(*(t[a:z].transpose(0, 1)[None] for t in (q, k, v)), is_causal=True)
        check("varlen_attn sequence %d..%d vs cuDNN" % (a, z), o[a:z], w[0].transpose(0, 1), 2e-2)

fattn.sdpa.disable()
q, k, v, do = (torch.randn(1, 8, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
names = kernels(lambda: run(SDPBackend.FLASH_ATTENTION, q, k, v, do, True))
if any("fwd_sm90" in n for n in names):
    failures.append("after disable(): fattn's kernels still run")
print("FAIL: %s" % failures if failures else "PASS")
sys.exit(1 if failures else 0)
