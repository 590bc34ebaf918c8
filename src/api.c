/* api.c - the public entry points: version, contexts, and the
 * engine-independent argument check of every call before it reaches an
 * engine.  The checks every call shares are api_check.c's; what only one
 * engine can serve (head dims, dtypes, varlen) is that engine's check
 * (internal.h); failures are recorded through error.c, the tensor helpers
 * live in tensor.c.
 *
 * Every call works on a private copy of its arguments: defaults are resolved
 * in the copy (packed strides, head_dim_v, softmax_scale) and the caller's
 * structs and buffers are never written until every check has passed. */
#include "api_check.h"
#include "cpu/kernels.h"
#include "engine_pick.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define FATTN_STR2(x) #x
#define FATTN_STR(x) FATTN_STR2(x)

const char *fattn_version_string(void) {
    return FATTN_STR(FATTN_VERSION_MAJOR) "." FATTN_STR(FATTN_VERSION_MINOR) "." FATTN_STR(
        FATTN_VERSION_PATCH);
}

int fattn_version_number(void) { return FATTN_VERSION_NUMBER; }

/* ------------------------------------------------------------------------ */
/* Contexts                                                                 */
/* ------------------------------------------------------------------------ */

fattn_status fattn_ctx_create(fattn_ctx **out, fattn_backend backend, int device) {
    fattn_clear_error(NULL);
    if (!out) return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    *out = NULL;
    if (backend != FATTN_BACKEND_AUTO && backend != FATTN_BACKEND_CPU &&
        backend != FATTN_BACKEND_CUDA)
        return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT,
                          "backend %d is not FATTN_BACKEND_AUTO, _CPU or _CUDA", (int)backend);
    if (device < 0)
        return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "device %d must be >= 0", device);

    /* AUTO: the CPU below sm_80 or without a GPU, else the CUDA engine that
     * fattn_engine_pick gives (engine_pick.h; Hopper's on sm_90, the portable
     * one on the others); FATTN_CUDA_ENGINE is read here, once */
    const char *engine_env = backend == FATTN_BACKEND_CPU ? NULL : getenv("FATTN_CUDA_ENGINE");
    fattn_backend chosen = backend;
    if (backend == FATTN_BACKEND_AUTO) {
        const int sm = fattn_cuda_device_sm(device);
        fattn_engine engine;
        char why[256];
        const fattn_status st = fattn_engine_pick(backend, sm, engine_env, &engine, why, sizeof why);
        if (st != FATTN_OK) return fattn_fail(NULL, st, "CUDA device %d: %s", device, why);
        chosen = engine == FATTN_ENGINE_CPU ? FATTN_BACKEND_CPU : FATTN_BACKEND_CUDA;
    }

    fattn_ctx *ctx = (fattn_ctx *)calloc(1, sizeof *ctx);
    if (!ctx)
        return fattn_fail(NULL, FATTN_ERROR_OUT_OF_MEMORY, "cannot allocate a context (%zu bytes)",
                          sizeof *ctx);
    ctx->backend = chosen;
    ctx->device = device;
    if (chosen == FATTN_BACKEND_CPU) {
        /* FATTN_CPU_ISA is read here, once per context, never during a call */
        const char *want = getenv("FATTN_CPU_ISA");
        if (want && *want) {
            const int r = fattn_cpu_isa_lookup(want, &ctx->cpu_isa);
            if (r != 0) {
                free(ctx);
                if (r == 1)
                    return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT,
                                      "FATTN_CPU_ISA=%.64s is not a CPU forward instance (one of %s, or unset)",
                                      want, fattn_cpu_isa_names);
                return fattn_fail(NULL, FATTN_ERROR_UNSUPPORTED,
                                  "FATTN_CPU_ISA=%.64s: this CPU (or build) cannot run that instance", want);
            }
        }
    }
    if (chosen == FATTN_BACKEND_CUDA) {
        fattn_status st = fattn_cuda_ctx_init(ctx, engine_env);
        if (st != FATTN_OK) {
            /* The engine wrote its reason into ctx->err; creation errors live
             * in the thread-local buffer. */
            fattn_fail(NULL, st, "%s", ctx->err[0] ? ctx->err : "CUDA context init failed");
            fattn_cuda_ctx_free(ctx);
            free(ctx);
            return st;
        }
    }
    fattn_clear_error(ctx);
    *out = ctx;
    return FATTN_OK;
}

fattn_status fattn_ctx_acquire(fattn_ctx *ctx, const char *fn) {
    if (!ctx) return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    int idle = 0;
    if (!__atomic_compare_exchange_n(&ctx->in_use, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return fattn_fail(NULL, FATTN_ERROR_BUSY,
                          "%s: the context is in use by a call on another thread (a context serves one "
                          "call at a time: use one context per thread)",
                          fn);
    fattn_clear_error(ctx);
    return FATTN_OK;
}

void fattn_ctx_release(fattn_ctx *ctx) { __atomic_store_n(&ctx->in_use, 0, __ATOMIC_RELEASE); }

void fattn_ctx_free(fattn_ctx *ctx) {
    if (!ctx) return;
    if (ctx->backend == FATTN_BACKEND_CUDA) fattn_cuda_ctx_free(ctx);
    free(ctx->fp8_ws);
    free(ctx);
}

fattn_backend fattn_ctx_backend(const fattn_ctx *ctx) {
    return ctx ? ctx->backend : FATTN_BACKEND_AUTO;
}

const char *fattn_ctx_engine(const fattn_ctx *ctx) {
    if (!ctx) return "";
    return ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_engine_name(ctx) : "cpu";
}

static fattn_status fattn_ctx_set_stream_held(fattn_ctx *ctx, void *stream) {
    if (ctx->backend == FATTN_BACKEND_CPU && stream != NULL)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "stream %p given to a CPU context (only NULL is allowed)", stream);
    ctx->stream = stream;
    return FATTN_OK;
}

static fattn_status fattn_ctx_set_threads_held(fattn_ctx *ctx, int threads) {
    if (threads < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "threads %d must be >= 0", threads);
    ctx->threads = threads;
    return FATTN_OK;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

/* The serving fields' scalars (fattn_fwd_args): they read nothing behind a
 * pointer, so they hold on every engine.  The entries of the arrays are the
 * engine's business (the CPU engine's host-side check,
 * fattn_cpu_serving_check; the CUDA engine never reads them on the host). */
static fattn_status check_serving(fattn_ctx *ctx, const fattn_fwd_args *a) {
    CHECK(fattn_check_aligned(ctx, a->seqused_k, sizeof(int32_t), "seqused_k", "int32"));
    CHECK(fattn_check_aligned(ctx, a->seqused_q, sizeof(int32_t), "seqused_q", "int32"));
    CHECK(fattn_check_aligned(ctx, a->cache_batch_idx, sizeof(int32_t), "cache_batch_idx", "int32"));
    CHECK(fattn_check_aligned(ctx, a->cache_leftpad, sizeof(int32_t), "cache_leftpad", "int32"));
    CHECK(fattn_check_paged(ctx, a->block_table, a->page_size, a->num_pages, a->max_pages_per_seq,
                            "without a block table "));
    if (a->cache_batch < 0 || (a->cache_batch && !a->cache_batch_idx))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "cache_batch %d: the batch entries of k and v with cache_batch_idx (>= 0, 0 = batch; "
                          "0 without cache_batch_idx)",
                          (int)a->cache_batch);
    if (a->cache_batch_idx && a->block_table)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "cache_batch_idx with block_table: the block table already picks each sequence's "
                          "pages (FlashAttention-3 refuses the pair too); give one or the other");
    if (a->cache_batch_idx && a->p.cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "cache_batch_idx with cu_seqlens_k: packed keys have no batch entries to pick "
                          "(cache_batch_idx needs fixed-length k and v)");
    if (!a->block_table) return FATTN_OK;
    const int64_t addressable = (int64_t)a->max_pages_per_seq * a->page_size;
    if (a->p.seqlen_k > addressable)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "seqlen_k %d exceeds max_pages_per_seq * page_size = %d * %d = %lld "
                          "(the block table cannot address every key)",
                          (int)a->p.seqlen_k, (int)a->max_pages_per_seq, (int)a->page_size,
                          (long long)addressable);
    if (a->p.cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "block_table with cu_seqlens_k (paged packed keys) is not supported: pass "
                          "cu_seqlens_q alone and each sequence's key count in seqused_k");
    return FATTN_OK;
}

fattn_status fattn_fwd_prepare(fattn_ctx *ctx, fattn_fwd_args *args, const int32_t *fp8_blocks,
                               int64_t *total_q, int64_t *total_k) {
    fattn_fwd_args a = *args;

    CHECK(fattn_check_problem(ctx, &a.p));
    CHECK(check_serving(ctx, &a));

    CHECK(fattn_check_dtype(ctx, a.q.dtype, "q"));
    CHECK(fattn_check_dtype(ctx, a.k.dtype, "k"));
    CHECK(fattn_check_dtype(ctx, a.v.dtype, "v"));
    CHECK(fattn_check_dtype(ctx, a.o.dtype, "o"));
    /* an FP8 KV cache (0.5): e4m3 k and v beside 16-bit or f32 q */
    const int kv8 = a.k.dtype == FATTN_DTYPE_E4M3 && a.q.dtype != FATTN_DTYPE_E4M3;
    if (kv8 && fp8_blocks)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "k.dtype e4m3: fattn_fwd_fp8 quantises f32, f16 or bf16 inputs itself (an e4m3 "
                          "KV cache goes to fattn_fwd)");
    if (!kv8) CHECK(fattn_check_same_dtype(ctx, &a.k, "k", a.q.dtype, "q"));
    CHECK(fattn_check_same_dtype(ctx, &a.v, "v", a.k.dtype, "k"));
    if (fp8_blocks) {
        /* fattn_fwd_fp8: 16-bit or f32 inputs, o any output dtype, scales ignored */
        if (a.q.dtype == FATTN_DTYPE_E4M3)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "q.dtype e4m3: fattn_fwd_fp8 quantises f32, f16 or bf16 inputs itself "
                              "(fattn_fwd takes e4m3 tensors)");
        if (a.o.dtype == FATTN_DTYPE_E4M3)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "o.dtype e4m3 is not an output dtype (o is f32, f16 or bf16)");
    } else if (a.q.dtype == FATTN_DTYPE_E4M3) {
        if (a.o.dtype == FATTN_DTYPE_E4M3)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "o.dtype e4m3 is not an output dtype (e4m3 inputs: o is f32, f16 "
                              "or bf16)");
    } else {
        CHECK(fattn_check_same_dtype(ctx, &a.o, "o", a.q.dtype, "q"));
    }
    if (!fp8_blocks) {
        CHECK(fattn_check_e4m3_scale(ctx, &a.q, "q"));
        CHECK(fattn_check_e4m3_scale(ctx, &a.k, "k"));
        CHECK(fattn_check_e4m3_scale(ctx, &a.v, "v"));
    }

    /* Null data pointers before anything reads cu_seqlens. */
    if (!a.q.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "q.data is NULL");
    if (!a.k.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "k.data is NULL");
    if (!a.v.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "v.data is NULL");
    if (!a.o.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "o.data is NULL");
    CHECK(fattn_check_data_aligned(ctx, &a.q, "q"));
    CHECK(fattn_check_data_aligned(ctx, &a.k, "k"));
    CHECK(fattn_check_data_aligned(ctx, &a.v, "v"));
    CHECK(fattn_check_data_aligned(ctx, &a.o, "o"));
    CHECK(fattn_check_aligned(ctx, a.lse, sizeof(float), "lse", "f32"));
    CHECK(fattn_check_aligned(ctx, a.learnable_sink, sizeof(float), "learnable_sink", "f32"));
    if (a.q.dtype == FATTN_DTYPE_E4M3)
        CHECK(fattn_check_aligned(ctx, a.q.scale, sizeof(float), "q.scale", "f32"));
    if (a.k.dtype == FATTN_DTYPE_E4M3) {
        CHECK(fattn_check_aligned(ctx, a.k.scale, sizeof(float), "k.scale", "f32"));
        CHECK(fattn_check_aligned(ctx, a.v.scale, sizeof(float), "v.scale", "f32"));
    }

    /* the engine's limits (internal.h), before anything reads cu_seqlens;
     * fattn_fwd_fp8 asks them about the e4m3 call it will make (the checks
     * read nothing behind a pointer: the scales are placeholders here) */
    {
        fattn_fwd_args e = a;
        if (fp8_blocks) {
            static float placeholder;
            fattn_tensor *t[3] = {&e.q, &e.k, &e.v};
            for (int i = 0; i < 3; i++) {
                t[i]->dtype = FATTN_DTYPE_E4M3;
                t[i]->scale = &placeholder;
                t[i]->scale_block = fp8_blocks[i];
            }
        }
        CHECK(ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_fwd_check(ctx, &e)
                                                 : fattn_cpu_fwd_check(ctx, &e));
    }
    fattn_tensor_shapes ts;
    CHECK(fattn_problem_shapes(ctx, &a.p, &ts));
    /* seqused_k and block_table entries: host memory on a CPU context only
     * (after fattn_problem_shapes, which has checked cu_seqlens on the host) */
    if (ctx->backend == FATTN_BACKEND_CPU) CHECK(fattn_cpu_serving_check(ctx, &a));
    if (a.cache_batch_idx && a.cache_batch) ts.k.batch = ts.v.batch = a.cache_batch;
    if (a.block_table) {
        /* k and v are page pools: [num_pages, page_size, heads_kv, dim] */
        fattn_shape4 *kv[2] = {&ts.k, &ts.v};
        for (int i = 0; i < 2; i++) {
            kv[i]->batch = a.num_pages;
            kv[i]->seqlen = a.page_size;
            kv[i]->seqlen_name = "page_size";
            kv[i]->batch_name = "num_pages";
        }
    }
    CHECK(fattn_check_tensor(ctx, &a.q, &ts.q));
    CHECK(fattn_check_tensor(ctx, &a.k, &ts.k));
    CHECK(fattn_check_tensor(ctx, &a.v, &ts.v));
    CHECK(fattn_check_tensor(ctx, &a.o, &ts.o));
    CHECK(fattn_check_no_self_overlap(ctx, &a.o, &ts.o));
    {
        const int64_t nb = ts.varlen ? 1 : a.p.batch, ncu = (int64_t)a.p.batch + 1;
        const int64_t ntable = a.block_table ? (int64_t)a.p.batch * a.max_pages_per_seq : 0;
        const fattn_span in[] = {fattn_tensor_span(&a.q, &ts.q),
                                 fattn_tensor_span(&a.k, &ts.k),
                                 fattn_tensor_span(&a.v, &ts.v),
                                 fattn_scale_span("q.scale", &a.q, &ts.q),
                                 fattn_scale_span("k.scale", &a.k, &ts.k),
                                 fattn_scale_span("v.scale", &a.v, &ts.v),
                                 fattn_array_span("cu_seqlens_q", a.p.cu_seqlens_q, ncu, sizeof(int32_t)),
                                 fattn_array_span("cu_seqlens_k", a.p.cu_seqlens_k, ncu, sizeof(int32_t)),
                                 fattn_array_span("seqused_k", a.seqused_k, a.p.batch, sizeof(int32_t)),
                                 fattn_array_span("block_table", a.block_table, ntable, sizeof(int32_t)),
                                 fattn_array_span("learnable_sink", a.learnable_sink, a.p.heads_q, sizeof(float)),
                                 fattn_array_span("seqused_q", a.seqused_q, a.p.batch, sizeof(int32_t)),
                                 fattn_array_span("cache_batch_idx", a.cache_batch_idx, a.p.batch, sizeof(int32_t)),
                                 fattn_array_span("cache_leftpad", a.cache_leftpad, a.p.batch, sizeof(int32_t))};
        const fattn_span out[] = {fattn_tensor_span(&a.o, &ts.o),
                                  fattn_array_span("lse", a.lse, nb * a.p.heads_q * ts.total_q, sizeof(float))};
        CHECK(fattn_check_disjoint(ctx, out, 2, in, (int)(sizeof in / sizeof in[0])));
    }
    /* e4m3 scales: host memory on a CPU context, read after every other check */
    if (!fp8_blocks && ctx->backend == FATTN_BACKEND_CPU) {
        CHECK(fattn_check_e4m3_scale_values(ctx, &a.q, &ts.q, "q.scale"));
        if (kv8) {
            /* a cache: only the used keys' scales (unwritten pages may hold anything) */
            CHECK(fattn_cpu_kv8_scale_check(ctx, &a));
        } else {
            CHECK(fattn_check_e4m3_scale_values(ctx, &a.k, &ts.k, "k.scale"));
            CHECK(fattn_check_e4m3_scale_values(ctx, &a.v, &ts.v, "v.scale"));
        }
    }
    if (total_q) *total_q = ts.total_q;
    if (total_k) *total_k = ts.total_k;
    *args = a;
    return FATTN_OK;
}

static fattn_status fattn_fwd_held(fattn_ctx *ctx, const fattn_fwd_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_fwd_args a = *args;
    CHECK(fattn_fwd_prepare(ctx, &a, NULL, NULL, NULL));
    return fattn_fwd_run(ctx, &a);
}

fattn_status fattn_fwd_run(fattn_ctx *ctx, const fattn_fwd_args *a) {
    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_fwd(ctx, a);
    return fattn_cpu_fwd(ctx, a);
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                 */
/* ------------------------------------------------------------------------ */

static fattn_status fattn_bwd_held(fattn_ctx *ctx, const fattn_bwd_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_bwd_args a = *args;

    CHECK(fattn_check_problem(ctx, &a.p));

    struct {
        fattn_tensor *t;
        const char *name;
    } all[] = {{&a.q, "q"},       {&a.k, "k"},   {&a.v, "v"},   {&a.o, "o"},
               {&a.dout, "dout"}, {&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
    const int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) CHECK(fattn_check_dtype(ctx, all[i].t->dtype, all[i].name));
    if (a.q.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "q.dtype e4m3 is not supported by the backward (f32, f16, bf16 only)");
    for (int i = 1; i < n; i++) CHECK(fattn_check_same_dtype(ctx, all[i].t, all[i].name, a.q.dtype, "q"));
    for (int i = 0; i < n; i++)
        if (!all[i].t->data)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.data is NULL", all[i].name);
    if (!a.lse)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "lse is NULL (the backward needs the forward's log-sum-exp)");
    for (int i = 0; i < n; i++) CHECK(fattn_check_data_aligned(ctx, all[i].t, all[i].name));
    CHECK(fattn_check_aligned(ctx, a.lse, sizeof(float), "lse", "f32"));
    if (a.dsink && !a.learnable_sink)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "dsink is given but learnable_sink is NULL (d(sink) needs the sink's values)");
    CHECK(fattn_check_aligned(ctx, a.learnable_sink, sizeof(float), "learnable_sink", "f32"));
    CHECK(fattn_check_aligned(ctx, a.dsink, sizeof(float), "dsink", "f32"));
    CHECK(fattn_check_aligned(ctx, a.seqused_q, sizeof(int32_t), "seqused_q", "int32"));
    CHECK(fattn_check_aligned(ctx, a.seqused_k, sizeof(int32_t), "seqused_k", "int32"));
    a.deterministic = a.deterministic != 0;

    /* the engine's limits (internal.h), before anything reads cu_seqlens */
    CHECK(ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_bwd_check(ctx, &a)
                                             : fattn_cpu_bwd_check(ctx, &a));
    fattn_tensor_shapes ts;
    CHECK(fattn_problem_shapes(ctx, &a.p, &ts));
    /* seqused_q/k entries: host memory on a CPU context only */
    if (ctx->backend == FATTN_BACKEND_CPU) CHECK(fattn_cpu_bwd_serving_check(ctx, &a));
    fattn_shape4 sdout = ts.o, sdq = ts.q, sdk = ts.k, sdv = ts.v;
    sdout.name = "dout";
    sdq.name = "dq";
    sdk.name = "dk";
    sdv.name = "dv";
    CHECK(fattn_check_tensor(ctx, &a.q, &ts.q));
    CHECK(fattn_check_tensor(ctx, &a.k, &ts.k));
    CHECK(fattn_check_tensor(ctx, &a.v, &ts.v));
    CHECK(fattn_check_tensor(ctx, &a.o, &ts.o));
    CHECK(fattn_check_tensor(ctx, &a.dout, &sdout));
    CHECK(fattn_check_tensor(ctx, &a.dq, &sdq));
    CHECK(fattn_check_tensor(ctx, &a.dk, &sdk));
    CHECK(fattn_check_tensor(ctx, &a.dv, &sdv));
    CHECK(fattn_check_no_self_overlap(ctx, &a.dq, &sdq));
    CHECK(fattn_check_no_self_overlap(ctx, &a.dk, &sdk));
    CHECK(fattn_check_no_self_overlap(ctx, &a.dv, &sdv));
    {
        const int64_t nb = ts.varlen ? 1 : a.p.batch, ncu = (int64_t)a.p.batch + 1;
        const fattn_span in[] = {fattn_tensor_span(&a.q, &ts.q),
                                 fattn_tensor_span(&a.k, &ts.k),
                                 fattn_tensor_span(&a.v, &ts.v),
                                 fattn_tensor_span(&a.o, &ts.o),
                                 fattn_array_span("seqused_q", a.seqused_q, a.p.batch, sizeof(int32_t)),
                                 fattn_array_span("seqused_k", a.seqused_k, a.p.batch, sizeof(int32_t)),
                                 fattn_tensor_span(&a.dout, &sdout),
                                 fattn_array_span("lse", a.lse, nb * a.p.heads_q * ts.total_q, sizeof(float)),
                                 fattn_array_span("cu_seqlens_q", a.p.cu_seqlens_q, ncu, sizeof(int32_t)),
                                 fattn_array_span("cu_seqlens_k", a.p.cu_seqlens_k, ncu, sizeof(int32_t)),
                                 fattn_array_span("learnable_sink", a.dsink ? a.learnable_sink : NULL, a.p.heads_q,
                                                  sizeof(float))};
        const fattn_span out[] = {fattn_tensor_span(&a.dq, &sdq), fattn_tensor_span(&a.dk, &sdk),
                                  fattn_tensor_span(&a.dv, &sdv),
                                  fattn_array_span("dsink", a.dsink, a.p.heads_q, sizeof(float))};
        CHECK(fattn_check_disjoint(ctx, out, 4, in, (int)(sizeof in / sizeof in[0])));
    }

    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_bwd(ctx, &a);
    return fattn_cpu_bwd(ctx, &a);
}

/* ------------------------------------------------------------------------ */
/* Quantisation                                                             */
/* ------------------------------------------------------------------------ */

/* The sizes of a dense [batch, seqlen, heads, head_dim] call (fattn_quantize,
 * fattn_merge): each >= 1. */
static fattn_status check_dense_sizes(fattn_ctx *ctx, int32_t batch, int32_t seqlen, int32_t heads,
                                      int32_t head_dim) {
    if (batch < 1) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "batch %d must be >= 1", (int)batch);
    if (seqlen < 1) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "seqlen %d must be >= 1", (int)seqlen);
    if (heads < 1) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "heads %d must be >= 1", (int)heads);
    if (head_dim < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "head_dim %d must be >= 1", (int)head_dim);
    return FATTN_OK;
}

static fattn_status fattn_quantize_held(fattn_ctx *ctx, const fattn_quantize_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_quantize_args a = *args;

    CHECK(check_dense_sizes(ctx, a.batch, a.seqlen, a.heads, a.head_dim));
    if (a.granularity != FATTN_QUANT_BLOCK && a.granularity != FATTN_QUANT_TENSOR)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "granularity %d is not FATTN_QUANT_BLOCK or FATTN_QUANT_TENSOR",
                          (int)a.granularity);
    if (a.block_rows < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "block_rows %d must be >= 1",
                          (int)a.block_rows);
    CHECK(fattn_check_dtype(ctx, a.in.dtype, "in"));
    CHECK(fattn_check_dtype(ctx, a.out.dtype, "out"));
    if (a.in.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "in.dtype e4m3 cannot be quantised (f32, f16 or bf16 only)");
    if (a.out.dtype != FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "out.dtype %s must be e4m3",
                          fattn_dtype_name(a.out.dtype));
    if (!a.out.scale)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "out.scale is NULL (it receives the scales)");
    a.out.scale_block = a.block_rows;
    a.rotate = a.rotate != 0;
    CHECK(fattn_check_data_aligned(ctx, &a.in, "in"));
    CHECK(fattn_check_aligned(ctx, a.out.scale, sizeof(float), "out.scale", "f32"));

    fattn_shape4 sin = {"in", a.batch, a.seqlen, a.heads, a.head_dim, "seqlen", "heads", "head_dim", 0, NULL};
    fattn_shape4 sout = sin;
    sout.name = "out";
    CHECK(fattn_check_tensor(ctx, &a.in, &sin));
    CHECK(fattn_check_tensor(ctx, &a.out, &sout));
    CHECK(fattn_check_no_self_overlap(ctx, &a.out, &sout));
    {
        const fattn_span in[] = {fattn_tensor_span(&a.in, &sin)};
        const fattn_span out[] = {fattn_tensor_span(&a.out, &sout), fattn_scale_span("out.scale", &a.out, &sout)};
        CHECK(fattn_check_disjoint(ctx, out, 2, in, 1));
    }

    if (a.rotate && (a.head_dim & (a.head_dim - 1)) != 0)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "rotate needs a power-of-two head_dim (Walsh-Hadamard); head_dim is %d",
                          (int)a.head_dim);
    /* the engine's limits (the CPU serves every head_dim) */
    if (ctx->backend == FATTN_BACKEND_CUDA) CHECK(fattn_cuda_quantize_check(ctx, &a));

    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_quantize(ctx, &a);
    return fattn_cpu_quantize(ctx, &a);
}

/* ------------------------------------------------------------------------ */
/* Merge of partial results                                                 */
/* ------------------------------------------------------------------------ */

static fattn_status check_merge_dtype(fattn_ctx *ctx, fattn_dtype d, const char *name) {
    CHECK(fattn_check_dtype(ctx, d, name));
    if (d == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s.dtype e4m3 is not supported by fattn_merge (f32, f16, bf16 only)", name);
    return FATTN_OK;
}

/* `a` is the private copy; `parts` (num_parts entries, checked by the
 * caller) receives the parts with their strides resolved. */
static fattn_status merge_prepare(fattn_ctx *ctx, fattn_merge_args *a, fattn_merge_part *parts) {
    char name[24], lname[24];
    fattn_shape4 so = {"o", a->batch, a->seqlen, a->heads, a->head_dim, "seqlen", "heads", "head_dim", 0,
                 NULL};
    CHECK(check_merge_dtype(ctx, a->o.dtype, "o"));
    for (int32_t i = 0; i < a->num_parts; i++) {
        snprintf(name, sizeof name, "parts[%d].o", (int)i);
        CHECK(check_merge_dtype(ctx, parts[i].o.dtype, name));
    }
    if (!a->o.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "o.data is NULL");
    for (int32_t i = 0; i < a->num_parts; i++) {
        if (!parts[i].o.data)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "parts[%d].o.data is NULL", (int)i);
        if (!parts[i].lse)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "parts[%d].lse is NULL (a part's weight is its log-sum-exp)", (int)i);
    }
    CHECK(fattn_check_data_aligned(ctx, &a->o, "o"));
    CHECK(fattn_check_aligned(ctx, a->lse, sizeof(float), "lse", "f32"));
    for (int32_t i = 0; i < a->num_parts; i++) {
        snprintf(name, sizeof name, "parts[%d].o", (int)i);
        snprintf(lname, sizeof lname, "parts[%d].lse", (int)i);
        CHECK(fattn_check_data_aligned(ctx, &parts[i].o, name));
        CHECK(fattn_check_aligned(ctx, parts[i].lse, sizeof(float), lname, "f32"));
    }

    /* the engine's limits */
    if (ctx->backend == FATTN_BACKEND_CUDA) CHECK(fattn_cuda_merge_check(ctx, a));

    CHECK(fattn_check_tensor(ctx, &a->o, &so));
    CHECK(fattn_check_no_self_overlap(ctx, &a->o, &so));
    /* fattn_check_tensor bounds batch * heads * seqlen below 2^31 */
    const int64_t nlse = (int64_t)a->batch * a->heads * a->seqlen;
    const fattn_span out[] = {fattn_tensor_span(&a->o, &so), fattn_array_span("lse", a->lse, nlse, sizeof(float))};
    for (int32_t i = 0; i < a->num_parts; i++) {
        fattn_shape4 sp = so;
        snprintf(name, sizeof name, "parts[%d].o", (int)i);
        snprintf(lname, sizeof lname, "parts[%d].lse", (int)i);
        sp.name = name;
        CHECK(fattn_check_tensor(ctx, &parts[i].o, &sp));
        const fattn_span in[] = {fattn_tensor_span(&parts[i].o, &sp),
                                 fattn_array_span(lname, parts[i].lse, nlse, sizeof(float))};
        CHECK(fattn_check_disjoint(ctx, out, 2, in, 2));
    }
    a->parts = parts;
    return FATTN_OK;
}

static fattn_status fattn_merge_held(fattn_ctx *ctx, const fattn_merge_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_merge_args a = *args;

    CHECK(check_dense_sizes(ctx, a.batch, a.seqlen, a.heads, a.head_dim));
    if (a.num_parts < 1 || a.num_parts > FATTN_MERGE_MAX_PARTS)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "num_parts %d must be in 1..%d",
                          (int)a.num_parts, FATTN_MERGE_MAX_PARTS);
    if (!a.parts) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "parts is NULL");

    /* The private copy of the parts, where their default strides are
     * resolved: the caller's array is never written. */
    fattn_merge_part *parts = (fattn_merge_part *)malloc((size_t)a.num_parts * sizeof *parts);
    if (!parts)
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cannot copy %d merge parts",
                          (int)a.num_parts);
    memcpy(parts, a.parts, (size_t)a.num_parts * sizeof *parts);
    fattn_status st = merge_prepare(ctx, &a, parts);
    if (st == FATTN_OK)
        st = ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_merge(ctx, &a) : fattn_cpu_merge(ctx, &a);
    free(parts);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Append to a KV cache                                                     */
/* ------------------------------------------------------------------------ */

/* The widest row fattn_kv_append takes on every engine: the CPU forward's
 * head_dim limit (src/cpu/limits.c), so that what it writes the CPU engine
 * can attend over, and a call valid on one engine is valid on all. */
#define FATTN_KV_APPEND_MAX_HEAD_DIM 512

static fattn_status check_kv_append_dtype(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    const struct {
        const fattn_tensor *t;
        const char *name;
    } all[] = {{&a->k_new, "k_new"}, {&a->v_new, "v_new"}, {&a->k_cache, "k_cache"}, {&a->v_cache, "v_cache"}};
    for (int i = 0; i < 4; i++) CHECK(fattn_check_dtype(ctx, all[i].t->dtype, all[i].name));
    CHECK(fattn_check_same_dtype(ctx, &a->v_new, "v_new", a->k_new.dtype, "k_new"));
    if (a->k_new.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "k_new.dtype e4m3: fattn_kv_append takes f32, f16 or bf16 new rows (an e4m3 "
                          "cache quantises them itself)");
    /* an FP8 cache (0.5): both caches e4m3, each with its scales */
    if (a->k_cache.dtype != FATTN_DTYPE_E4M3)
        CHECK(fattn_check_same_dtype(ctx, &a->k_cache, "k_cache", a->k_new.dtype, "k_new"));
    CHECK(fattn_check_same_dtype(ctx, &a->v_cache, "v_cache", a->k_cache.dtype, "k_cache"));
    CHECK(fattn_check_e4m3_scale(ctx, &a->k_cache, "k_cache"));
    CHECK(fattn_check_e4m3_scale(ctx, &a->v_cache, "v_cache"));
    if (a->k_cache.dtype == FATTN_DTYPE_E4M3) {
        CHECK(fattn_check_aligned(ctx, a->k_cache.scale, sizeof(float), "k_cache.scale", "f32"));
        CHECK(fattn_check_aligned(ctx, a->v_cache.scale, sizeof(float), "v_cache.scale", "f32"));
    }
    for (int i = 0; i < 4; i++)
        if (!all[i].t->data)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.data is NULL", all[i].name);
    for (int i = 0; i < 4; i++) CHECK(fattn_check_data_aligned(ctx, all[i].t, all[i].name));
    return FATTN_OK;
}

static fattn_status fattn_kv_append_held(fattn_ctx *ctx, const fattn_kv_append_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_kv_append_args a = *args;

    if (a.batch < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "batch %d must be >= 1", (int)a.batch);
    if (a.seqlen_new < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "seqlen_new %d must be >= 1 (the new rows per sequence)", (int)a.seqlen_new);
    if (a.heads_kv < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "heads_kv %d must be >= 1", (int)a.heads_kv);
    if (a.head_dim < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "head_dim %d must be >= 1", (int)a.head_dim);
    if (a.head_dim > FATTN_KV_APPEND_MAX_HEAD_DIM)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d is not supported by fattn_kv_append (1..%d, the CPU forward's "
                          "limit)",
                          (int)a.head_dim, FATTN_KV_APPEND_MAX_HEAD_DIM);
    CHECK(fattn_check_aligned(ctx, a.cache_seqlens, sizeof(int32_t), "cache_seqlens", "int32"));
    CHECK(fattn_check_paged(ctx, a.block_table, a.page_size, a.num_pages, a.max_pages_per_seq,
                            "a contiguous cache: "));
    if (!a.block_table && a.capacity < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "capacity %d must be >= 1 (the rows per sequence of a contiguous cache)",
                          (int)a.capacity);
    CHECK(check_kv_append_dtype(ctx, &a));
    if (!a.cache_seqlens)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "cache_seqlens is NULL (required: the cache row where each sequence's new "
                          "rows start)");

    fattn_shape4 skn = {"k_new", a.batch, a.seqlen_new, a.heads_kv, a.head_dim, "seqlen_new", "heads_kv",
                  "head_dim", 0, NULL};
    fattn_shape4 svn = skn;
    svn.name = "v_new";
    fattn_shape4 skc = {"k_cache", a.batch, a.capacity, a.heads_kv, a.head_dim, "capacity", "heads_kv",
                  "head_dim", 0, NULL};
    if (a.block_table) {
        skc.batch = a.num_pages;
        skc.seqlen = a.page_size;
        skc.seqlen_name = "page_size";
        skc.batch_name = "num_pages";
    }
    fattn_shape4 svc = skc;
    svc.name = "v_cache";
    CHECK(fattn_check_tensor(ctx, &a.k_new, &skn));
    CHECK(fattn_check_tensor(ctx, &a.v_new, &svn));
    CHECK(fattn_check_tensor(ctx, &a.k_cache, &skc));
    CHECK(fattn_check_tensor(ctx, &a.v_cache, &svc));
    CHECK(fattn_check_no_self_overlap(ctx, &a.k_cache, &skc));
    CHECK(fattn_check_no_self_overlap(ctx, &a.v_cache, &svc));
    {
        const int64_t ntable = a.block_table ? (int64_t)a.batch * a.max_pages_per_seq : 0;
        const fattn_span in[] = {fattn_tensor_span(&a.k_new, &skn), fattn_tensor_span(&a.v_new, &svn),
                                 fattn_array_span("cache_seqlens", a.cache_seqlens, a.batch, sizeof(int32_t)),
                                 fattn_array_span("block_table", a.block_table, ntable, sizeof(int32_t))};
        /* an FP8 cache's scales are read and written: outputs */
        const fattn_span out[] = {fattn_tensor_span(&a.k_cache, &skc), fattn_tensor_span(&a.v_cache, &svc),
                                  fattn_scale_span("k_cache.scale", &a.k_cache, &skc),
                                  fattn_scale_span("v_cache.scale", &a.v_cache, &svc)};
        CHECK(fattn_check_disjoint(ctx, out, 4, in, 4));
    }
    if (a.block_table) a.capacity = 0; /* ignored: the engines never see a stale value */

    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_kv_append(ctx, &a);
    return fattn_cpu_kv_append(ctx, &a);
}

/* ------------------------------------------------------------------------ */
/* Entry points: the context's in-use flag around each call                 */
/* ------------------------------------------------------------------------ */

/* fattn_NAME(ctx, arg): fattn_NAME_held between acquire and release (the
 * refusal names the call) */
#define FATTN_ENTRY(name, type)                              \
    fattn_status name(fattn_ctx *ctx, type arg) {            \
        fattn_status st = fattn_ctx_acquire(ctx, #name);     \
        if (st != FATTN_OK) return st;                       \
        st = name##_held(ctx, arg);                          \
        fattn_ctx_release(ctx);                              \
        return st;                                           \
    }
FATTN_ENTRY(fattn_ctx_set_stream, void *)
FATTN_ENTRY(fattn_ctx_set_threads, int)
FATTN_ENTRY(fattn_fwd, const fattn_fwd_args *)
FATTN_ENTRY(fattn_bwd, const fattn_bwd_args *)
FATTN_ENTRY(fattn_quantize, const fattn_quantize_args *)
FATTN_ENTRY(fattn_merge, const fattn_merge_args *)
FATTN_ENTRY(fattn_kv_append, const fattn_kv_append_args *)
#undef FATTN_ENTRY
