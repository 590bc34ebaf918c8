"""train_gpt.py - a real client, trained (issue 25, item 5): a GPT-style transformers model,
random init, trained on the Python standard library's own sources (byte-level tokens),
once with attn_implementation="sdpa" and once with "fattn" (fattn/hf.py), from one seed, with
the same data order, optimizer and LR schedule; the loss curves are compared against a
measured bf16-noise reference, and the step time and the attention's share of it reported.

    # H200 (one 10-minute device call; nothing downloads: config built in code, corpus on disk)
    FATTN_LIBRARY=build/libfattn.so python3 bench/train_gpt.py --impl both --noise-reference \\
        --out bench/results/train-gpt --steps 300
    # then, wherever matplotlib is (the plot step needs no GPU and no torch run):
    python3 bench/train_gpt.py --out bench/results/train-gpt --plot docs/img/train-gpt.png

    # CPU smoke test (fattn's CPU engine, fp32; measured: the two runs' losses equal to the
    # last bit at every step of 5, ~10 s)
    FATTN_LIBRARY=build-cpu/libfattn.so python3 bench/train_gpt.py --device cpu --tiny --steps 5 \\
        --impl both --out /tmp/tg

Corpus: every .py under sysconfig.get_paths()["stdlib"] (site-packages, dist-packages and
__pycache__ left out), in sorted relative-path order, as bytes (vocab 256, no tokenizer).
Every 20th file (index % 20 == 19) is validation, the rest training, each concatenated with
a newline between files.  The corpus depends on the Python that runs it (~30 MB for 3.11);
its sha256 goes into the JSON, so two runs can be checked to have read the same text.
Batches: seq+1 windows at offsets drawn once, up front, from torch.Generator seeded with
seed+1 (validation: seed+2, a fixed set of --val-batches batches); both runs read the same
windows in the same order.

Model (defaults): GPT-2 (transformers' GPT2LMHeadModel from a GPT2Config built here),
12 layers, n_embd 768, 12 heads (head dim 64), context 1024, vocab 256, tied embeddings:
~86M parameters (GPT-2 small's body; the 50k-token embedding it lacks is most of GPT-2 small's
124M).  All dropouts 0 (fattn refuses attention dropout, and dropout would make the runs differ
by their RNG use).  --arch llama: LlamaConfig (RoPE, SwiGLU, RMSNorm, untied), e.g.
--arch llama --heads 6 for head dim 128 (~85M).  torch.manual_seed(seed) before from_config:
the same initial weights for every run (their checksum goes into the JSON).  Under autocast,
Llama's RoPE gives fp32 q and k beside a bf16 v; SDPA is cast by autocast, fattn by
fattn.hf itself (to the autocast dtype, as autocast does for SDPA).
Training: fp32 master weights, torch.autocast(bf16) on CUDA (fp32 without autocast on the CPU;
--dtype picks), AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only; fused on
CUDA), LR 6e-4 with linear warmup over the first 10% of the steps and cosine decay to 10%,
grad-norm clip 1.0, cross entropy in fp32 on the logits.  Causal attention, no attention mask
passed (so transformers hands both implementations mask=None, is_causal).

Runs (--impl sdpa|fattn|both; --noise-reference adds "sdpa_ref") each write OUT/<name>.json:
the loss, grad norm and LR per step, the validation loss every --val-every steps, the median
step time, and the attention's forward and backward time and its share of the step.
sdpa_ref is SDPA again with another of its kernels (--ref-backend, default the memory-efficient
one; "same" repeats sdpa's own choice, which shows whether that one is run-to-run
deterministic): two implementations of one attention that differ only in their rounding, so
|loss_ref - loss_sdpa| is what bf16 noise does to these curves.  The comparison prints the max
and mean |loss_fattn - loss_sdpa| beside it and a one-line verdict: fattn agrees within bf16
noise when both statistics are <= 2x the reference's.

Attention share: CUDA events, on a few steps in the middle of the run (--attn-steps, not
counted in the median step time).  Each attention call of the model (transformers'
AttentionInterface entry, wrapped here) gets events before and after it in the forward, and,
through identity autograd functions on its inputs and its output, events where its backward
begins (the output's gradient arrives) and ends (q, k and v's gradients leave).  Caveats:
the intervals are stream time between the records, so they include the host-side work of the
call (fattn's Python wrapper, SDPA's dispatch) where the GPU waits for it, i.e. where the
step is launch-bound; they include the layout work inside each implementation's entry (the
transpose/contiguous SDPA's wrapper does; any copy fattn makes); the backward interval relies
on autograd running the attention's backward nodes back to back (it does: nothing else is
ready between them, each layer's skip path waits on this gradient).  On the CPU the same
brackets use time.perf_counter (the CPU's autograd runs synchronously in this thread).

Estimated H200 time (not yet run on a GPU): 86M params x 16 x 1024 tokens = ~8.5 TFLOP per
step for the dense part + ~1.1 TFLOP of causal attention (fwd + bwd); eager PyTorch without
torch.compile at 25-40% of the H200's bf16 peak: ~30-60 ms/step, so 300 steps ~10-20 s per
run, plus ~1 s of validation, model set-up and the corpus read (~30 MB, a few seconds): three
runs (sdpa, fattn, sdpa_ref) about 1-2 minutes, well inside one 10-minute call.  The script
prints an ETA after 10 steps of each run and writes its JSON (complete: false) at every
validation, so a run cut short still leaves its curve so far.
"""
import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
VOCAB = 256
RUNS = ("sdpa", "fattn", "sdpa_ref")
SDPA_CHOICE = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


# ---------------------------------------------------------------------------------------------------- corpus

def load_corpus():
    """(train bytes, val bytes, info): the stdlib's .py files in sorted relative-path order."""
    root = sysconfig.get_paths()["stdlib"]
    rel = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        rel += [os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for f in files if f.endswith(".py")]
    rel.sort()
    train, val = [], []
    for i, p in enumerate(rel):
        with open(os.path.join(root, p), "rb") as f:
            (val if i % 20 == 19 else train).append(f.read())
    train, val = b"\n".join(train), b"\n".join(val)
    h = hashlib.sha256(train)
    h.update(b"\0")
    h.update(val)
    info = {"root": root, "files": len(rel), "train_bytes": len(train), "val_bytes": len(val),
            "sha256": h.hexdigest(), "python": platform.python_version()}
    return train, val, info


def windows(torch, data, count, batch, seq, seed):
    """[count, batch, seq+1] uint8 windows of data at offsets from a seeded generator."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    g = torch.Generator().manual_seed(seed)
    off = torch.randint(0, t.numel() - seq - 1, (count, batch), generator=g)
    return t[off[..., None] + torch.arange(seq + 1)], off


# ---------------------------------------------------------------------------------------------------- model

def make_config(args):
    common = dict(vocab_size=VOCAB, use_cache=False, bos_token_id=1, eos_token_id=2)
    if args.arch == "gpt2":
        from transformers import GPT2Config
        return GPT2Config(n_positions=args.seq, n_embd=args.dim, n_layer=args.layers, n_head=args.heads,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    from transformers import LlamaConfig
    ffn = args.ffn or 64 * round(8 * args.dim / 3 / 64)
    return LlamaConfig(hidden_size=args.dim, intermediate_size=ffn, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.kv_heads or args.heads,
                       max_position_embeddings=args.seq, attention_dropout=0.0, tie_word_embeddings=False,
                       **common)


class Probe:
    """Wraps an AttentionInterface function: counts the calls, notes what the first one was
    given, and on timed steps brackets each call's forward and backward with markers (CUDA
    events, or perf_counter on the CPU).  Off, it is one Python call and a flag test."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.on, self.calls, self.info, self.recs = False, 0, {}, []
        probe = self

        class In(torch.autograd.Function):  # gradients of q, k, v leave: the backward ends
            @staticmethod
            def forward(ctx, rec, q, k, v):
                ctx.rec = rec
                return q.view_as(q), k.view_as(k), v.view_as(v)

            @staticmethod
            def backward(ctx, gq, gk, gv):
                ctx.rec["be"] = probe.mark()
                return None, gq, gk, gv

        class Out(torch.autograd.Function):  # the output's gradient arrives: the backward begins
            @staticmethod
            def forward(ctx, rec, o):
                ctx.rec = rec
                return o.view_as(o)

            @staticmethod
            def backward(ctx, go):
                ctx.rec["bs"] = probe.mark()
                return None, go

        self.In, self.Out = In, Out

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def wrap(self, fn, impl):
        torch = self.torch

        def attention(module, query, key, value, attention_mask, *a, **kw):
            self.calls += 1
            if not self.info and module.training and torch.is_grad_enabled():  # the first training call
                self.info = {"mask_is_none": attention_mask is None,
                             "dtype": "/".join(str(t.dtype).replace("torch.", "") for t in (query, key, value)),
                             "q_shape": list(query.shape), "k_shape": list(key.shape),
                             "module_training": bool(module.training), "dropout": kw.get("dropout", 0.0),
                             "is_causal_kw": kw.get("is_causal"),
                             "module_is_causal": getattr(module, "is_causal", None)}
                if impl.startswith("sdpa") and query.is_cuda:
                    try:  # the kernel SDPA dispatches to (a private torch function; a note only)
                        c = torch._fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True)
                        self.info["sdpa_backend"] = SDPA_CHOICE.get(int(c), str(c))
                    except Exception as e:  # noqa: BLE001
                        self.info["sdpa_backend"] = "unknown (%s)" % type(e).__name__
            if not (self.on and torch.is_grad_enabled()):
                return fn(module, query, key, value, attention_mask, *a, **kw)
            rec = {}
            self.recs.append(rec)
            query, key, value = self.In.apply(rec, query, key, value)
            rec["fs"] = self.mark()
            out, w = fn(module, query, key, value, attention_mask, *a, **kw)
            rec["fe"] = self.mark()
            return self.Out.apply(rec, out), w
        return attention

    def collect(self):
        """(forward ms, backward ms) summed over the calls since the last collect."""
        f = sum(self.ms(r["fs"], r["fe"]) for r in self.recs)
        b = sum(self.ms(r["bs"], r["be"]) for r in self.recs if "bs" in r and "be" in r)
        n = len(self.recs)
        self.recs = []
        return f, b, n


def register(torch, device, impl):
    """Wrap the AttentionInterface entry the run uses (class-wide: every model's lookup sees it)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    probe = Probe(torch, device)
    name = "fattn" if impl == "fattn" else "sdpa"
    if impl == "fattn":
        import fattn.hf
        fattn.hf.register()
        base = fattn.hf.attention_forward
    else:
        if not hasattr(register, "sdpa"):
            register.sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]  # transformers' own, before any wrapping
        base = register.sdpa
    AttentionInterface.register(name, probe.wrap(base, impl))
    return name, probe


def sdpa_context(backend):
    if backend in (None, "auto", "same"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]])


# ---------------------------------------------------------------------------------------------------- training

def lr_at(args, s):
    warm = max(1, args.steps // 10)
    if s < warm:
        return args.lr * (s + 1) / warm
    t = (s - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train(args, run, corpus):
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoModelForCausalLM

    impl = "fattn" if run == "fattn" else "sdpa"
    backend = args.ref_backend if run == "sdpa_ref" else args.sdpa_backend
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    name, probe = register(torch, device, impl)
    train_b, val_b, cinfo = corpus

    data, off = windows(torch, train_b, args.steps, args.batch, args.seq, args.seed + 1)
    vdata, _ = windows(torch, val_b, args.val_batches, args.batch, args.seq, args.seed + 2)
    data_sha = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    data, vdata = data.to(device), vdata.to(device)

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(make_config(args), attn_implementation=name).to(device)
    params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in params)
    with torch.no_grad():
        checksum = float(sum(p.double().sum() for p in params))
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    bf16 = args.dtype == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def loss_of(x):
        with autocast():
            logits = model(input_ids=x[:, :-1].long(), use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), x[:, 1:].long().reshape(-1))

    def evaluate():
        model.eval()
        with torch.no_grad():
            v = sum(loss_of(vdata[i]).item() for i in range(vdata.shape[0])) / vdata.shape[0]
        model.train()
        return v

    t_start = min(20, args.steps // 2)
    timed = set(range(t_start, min(args.steps, t_start + args.attn_steps)))
    warm = min(10, args.steps // 5)
    val_steps = set(range(0, args.steps + 1, args.val_every)) | {args.steps}
    res = {"run": run, "impl": impl, "attn_implementation": name, "sdpa_backend_requested": backend if impl == "sdpa"
           else None, "complete": False, "args": vars(args), "n_params": n_params, "init_checksum": checksum,
           "corpus": cinfo, "data_sha256": data_sha, "loss": [], "grad_norm": [], "lr": [], "val": [],
           "step_s": [], "attn": [],
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "python": platform.python_version()},
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
           else "CPU (%s, %d threads)" % (platform.machine(), torch.get_num_threads())}
    if impl == "fattn":
        import fattn
        res["fattn"] = {"library": fattn.library_path, "version": fattn.__version__}
    print("[%s] %s %dL d%d h%d (head dim %d), %.1fM params, batch %d x %d, %d steps, %s, attn %s%s"
          % (run, args.arch, args.layers, args.dim, args.heads, args.dim // args.heads, n_params / 1e6, args.batch,
             args.seq, args.steps, args.dtype, name, (" (SDPA backend %s)" % backend) if impl == "sdpa" else ""),
          flush=True)

    def save(path=os.path.join(args.out, run + ".json")):
        with open(path + ".tmp", "w") as f:
            json.dump(res, f)
        os.replace(path + ".tmp", path)

    model.train()
    with sdpa_context(backend):
        t_run = time.perf_counter()
        for s in range(args.steps + 1):
            if s in val_steps:
                res["val"].append([s, evaluate()])
                save()
            if s == args.steps:
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(args, s)
            probe.on = s in timed
            sync()
            t0 = time.perf_counter()
            if probe.on:
                e0 = probe.mark()
            loss = loss_of(data[s])
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if probe.on:
                e1 = probe.mark()
            lv, gv = loss.item(), gn.item()
            sync()
            dt = time.perf_counter() - t0
            res["loss"].append(lv)
            res["grad_norm"].append(gv)
            res["lr"].append(lr_at(args, s))
            res["step_s"].append(dt)
            if probe.on:
                f, b, n = probe.collect()
                res["attn"].append({"step": s, "fwd_ms": f, "bwd_ms": b, "calls": n, "step_ms": probe.ms(e0, e1)})
            if not math.isfinite(lv):
                print("[%s] step %d: loss %r, stopping" % (run, s, lv), flush=True)
                break
            if s == 10:
                per = statistics.median(res["step_s"][1:])
                print("[%s] ETA %.0f s (%.1f ms/step)" % (run, per * (args.steps - 11), per * 1e3), flush=True)
            if s % args.log_every == 0 or s == args.steps - 1:
                print("[%s] step %4d  loss %.4f  |g| %.3f  lr %.2e  %.1f ms"
                      % (run, s, lv, gv, lr_at(args, s), dt * 1e3), flush=True)
        wall = time.perf_counter() - t_run

    steady = [t for i, t in enumerate(res["step_s"]) if i >= warm and i not in timed] or res["step_s"]
    res["median_step_ms"] = statistics.median(steady) * 1e3
    res["tokens_per_s"] = args.batch * args.seq / statistics.median(steady)
    res["wall_s"] = wall
    res["probe"] = dict(probe.info, calls_total=probe.calls,
                        calls_per_step=probe.calls / max(1, len(res["loss"]) + len(res["val"]) * args.val_batches))
    if res["attn"]:
        a = res["attn"]
        fw, bw, st = (statistics.median(x[k] for x in a) for k in ("fwd_ms", "bwd_ms", "step_ms"))
        res["attn_fwd_ms"], res["attn_bwd_ms"], res["attn_step_ms"] = fw, bw, st
        res["attn_share"] = statistics.median((x["fwd_ms"] + x["bwd_ms"]) / x["step_ms"] for x in a)
    if device.type == "cuda":
        res["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    res["complete"] = len(res["loss"]) == args.steps
    save()
    print("[%s] done: median step %.2f ms (%.0f tok/s), attention %s of the step (fwd %s + bwd %s ms of %s), "
          "first call: mask %s, %s, training %s%s; %.1f s"
          % (run, res["median_step_ms"], res["tokens_per_s"],
             "%.1f%%" % (100 * res["attn_share"]) if "attn_share" in res else "n/a",
             "%.2f" % res.get("attn_fwd_ms", float("nan")), "%.2f" % res.get("attn_bwd_ms", float("nan")),
             "%.2f" % res.get("attn_step_ms", float("nan")),
             "None" if probe.info.get("mask_is_none") else "GIVEN", probe.info.get("dtype"),
             probe.info.get("module_training"),
             (", SDPA kernel %s" % probe.info["sdpa_backend"]) if "sdpa_backend" in probe.info else "", wall),
          flush=True)
    del model, opt, params, groups, data, vdata
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return res


# ---------------------------------------------------------------------------------------------------- comparison

SAME = ("arch", "steps", "batch", "seq", "layers", "dim", "heads", "kv_heads", "ffn", "lr", "seed", "device", "dtype")


def load_runs(out):
    """OUT's runs; one whose set-up differs from sdpa.json's (a stale file) is left out, with a warning."""
    runs = {}
    for r in RUNS:
        p = os.path.join(out, r + ".json")
        if os.path.exists(p):
            with open(p) as f:
                runs[r] = json.load(f)
    base = runs.get("sdpa")
    for r in list(runs):
        if base is None or r == "sdpa":
            continue
        bad = [k for k in SAME if runs[r]["args"].get(k) != base["args"].get(k)]
        bad += [k for k in ("data_sha256", "init_checksum") if runs[r][k] != base[k]]
        if bad:
            print("WARNING: %s.json differs from sdpa.json in %s: left out" % (r, ", ".join(bad)))
            del runs[r]
        elif not runs[r]["complete"]:
            print("WARNING: %s.json is incomplete (%d of %d steps)" % (r, len(runs[r]["loss"]), base["args"]["steps"]))
    return runs


def diff(a, b):
    n = min(len(a["loss"]), len(b["loss"]))
    return [abs(x - y) for x, y in zip(a["loss"][:n], b["loss"][:n])]


def kernel(run):
    """SDPA's kernel in a run: the one it dispatched to (CUDA), else the one requested."""
    return run.get("probe", {}).get("sdpa_backend") or run.get("sdpa_backend_requested") or "?"


def compare(out):
    runs = load_runs(out)
    if "sdpa" not in runs or "fattn" not in runs:
        return None
    s, f = runs["sdpa"], runs["fattn"]
    d = diff(f, s)
    noise = "bf16" if s["args"]["dtype"] == "bf16" else s["args"]["dtype"]
    if not d:
        return None
    print("|loss_fattn - loss_sdpa| over %d steps: max %.3g (step %d), mean %.3g, step 0 %.3g; "
          "final val loss sdpa %.4f fattn %.4f"
          % (len(d), max(d), d.index(max(d)), sum(d) / len(d), d[0], s["val"][-1][1], f["val"][-1][1]))
    verdict = None
    if "sdpa_ref" in runs:
        r = diff(runs["sdpa_ref"], s)
        ref = "SDPA %s vs SDPA %s" % (kernel(runs["sdpa_ref"]), kernel(s))
        print("|loss_ref - loss_sdpa| (%s) over %d steps: max %.3g (step %d), mean %.3g, step 0 %.3g"
              % (ref, len(r), max(r), r.index(max(r)), sum(r) / len(r), r[0]))
        mx, mn = max(d) / max(r) if max(r) else math.inf, (sum(d) / len(d)) / (sum(r) / len(r)) if sum(r) else math.inf
        ok = mx <= 2 and mn <= 2
        verdict = ("VERDICT: fattn %s within %s noise: max |d| %.3g vs reference %.3g (%.2fx), mean %.3g vs %.3g "
                   "(%.2fx); criterion <= 2x" % ("agrees" if ok else "does NOT agree", noise, max(d), max(r), mx,
                                                 sum(d) / len(d), sum(r) / len(r), mn))
        if not max(r):
            verdict += " (the reference is identical to sdpa: no noise measured; pick another --ref-backend)"
    else:
        verdict = ("VERDICT: no reference run (--noise-reference): max |d| %.3g, mean %.3g, step 0 %.3g, "
                   "not judged" % (max(d), sum(d) / len(d), d[0]))
    print(verdict)
    for name, x in runs.items():
        if "median_step_ms" in x:
            print("  %-8s median step %.2f ms, attention %s (fwd %.2f + bwd %.2f ms)"
                  % (name, x["median_step_ms"], "%.1f%%" % (100 * x["attn_share"]) if "attn_share" in x else "n/a",
                     x.get("attn_fwd_ms", float("nan")), x.get("attn_bwd_ms", float("nan"))))
    return verdict


def plot(out, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load_runs(out)
    if "sdpa" not in runs or "fattn" not in runs:
        sys.exit("plot: %s needs sdpa.json and fattn.json" % out)
    verdict = compare(out)
    s = runs["sdpa"]
    a = s["args"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    style = {"sdpa": dict(color="C0", lw=1.2), "fattn": dict(color="C3", lw=1.0, ls="--"),
             "sdpa_ref": dict(color="0.5", lw=0.8, ls=":")}
    for name, r in runs.items():
        lab = "sdpa (%s)" % kernel(r) if name.startswith("sdpa") else name
        if "median_step_ms" in r:
            lab += ", %.1f ms/step" % r["median_step_ms"]
            if "attn_share" in r:
                lab += ", attn %.0f%%" % (100 * r["attn_share"])
        ax.plot(range(len(r["loss"])), r["loss"], label=lab, **style[name])
        if r["val"]:
            ax.plot(*zip(*r["val"]), "o", ms=4, color=style[name]["color"], mfc="none")
    ax.set_ylabel("training loss (nats/byte); o: validation")
    ax.set_title("%s %dL d%d h%d, %.1fM params, batch %dx%d, %s, %s"
                 % (a["arch"], a["layers"], a["dim"], a["heads"], s["n_params"] / 1e6, a["batch"], a["seq"], a["dtype"],
                    s.get("device_name", "")), fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    f = runs["fattn"]
    n = min(len(s["loss"]), len(f["loss"]))
    bx.plot(range(n), [x - y for x, y in zip(f["loss"][:n], s["loss"][:n])], color="C3", lw=0.8, label="fattn - sdpa")
    if "sdpa_ref" in runs:
        rr = runs["sdpa_ref"]
        m = min(len(s["loss"]), len(rr["loss"]))
        bx.plot(range(m), [x - y for x, y in zip(rr["loss"][:m], s["loss"][:m])], color="0.5", lw=0.8,
                label="sdpa ref - sdpa (bf16 noise)")
    bx.axhline(0, color="k", lw=0.5)
    bx.set_xlabel("step")
    bx.set_ylabel("loss difference")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    if verdict:
        fig.text(0.01, 0.005, verdict.replace("VERDICT: ", ""), fontsize=6.5)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=120)
    print("wrote", png)


# ---------------------------------------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--impl", choices=("sdpa", "fattn", "both"), help="the run(s) to train (none: only --plot)")
    p.add_argument("--noise-reference", action="store_true", help="also train sdpa_ref (SDPA, --ref-backend)")
    p.add_argument("--ref-backend", default="efficient", choices=("efficient", "flash", "cudnn", "math", "same"))
    p.add_argument("--sdpa-backend", default="auto", choices=("auto", "efficient", "flash", "cudnn", "math"),
                   help="SDPA's kernel in the sdpa run (auto: torch's choice, noted in the JSON)")
    p.add_argument("--arch", default="gpt2", choices=("gpt2", "llama"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=0, help="llama: K/V heads (0: --heads)")
    p.add_argument("--ffn", type=int, default=0, help="llama: intermediate size (0: 8/3 dim, rounded to 64)")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke test defaults: 2 layers, dim 64, 4 heads, seq 128, batch 2, 2 val batches")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", choices=("bf16", "fp32"), help="bf16: fp32 weights + bf16 autocast (default on cuda); "
                   "fp32 (default on cpu)")
    p.add_argument("--val-every", type=int, default=50)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--attn-steps", type=int, default=10, help="steps timed for the attention's share")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--out", default="bench/results/train-gpt", help="directory of the runs' JSONs")
    p.add_argument("--plot", metavar="PNG", help="plot OUT's sdpa.json and fattn.json (and sdpa_ref.json) to PNG")
    if "--tiny" in sys.argv[1:]:  # the preset's values as defaults: options given beside it still count
        p.set_defaults(layers=2, dim=64, heads=4, seq=128, batch=2, val_batches=2)
    args = p.parse_args()
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if not args.impl and not args.plot:
        p.error("give --impl (train) and/or --plot")
    if args.impl:
        import torch
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device (use --device cpu)")
        os.makedirs(args.out, exist_ok=True)
        t = time.perf_counter()
        corpus = load_corpus()
        c = corpus[2]
        print("corpus: %d files under %s (Python %s), %.1f MB train, %.1f MB val, sha256 %s..., read in %.1f s"
              % (c["files"], c["root"], c["python"], c["train_bytes"] / 1e6, c["val_bytes"] / 1e6, c["sha256"][:12],
                 time.perf_counter() - t), flush=True)
        runs = ["sdpa", "fattn"] if args.impl == "both" else [args.impl]
        if args.noise_reference:
            runs.append("sdpa_ref")
        for r in runs:
            train(args, r, corpus)
        compare(args.out)
    if args.plot:
        plot(args.out, args.plot)


if __name__ == "__main__":
    main()
