/* merge_bw.cu - bandwidth of fattn_merge on the GPU (CUDA events around each
 * call, median of many), next to a device-to-device cudaMemcpyAsync moving
 * the same bytes, timed interleaved with it.
 *   GB/s = (bytes read + bytes written) / median time: every part's O and
 *   LSE read once, o and lse written once; the copy of n bytes moves 2 n,
 *   n = half the merge's bytes.  "ratio" = merge GB/s / copy GB/s, the
 *   share of what the memory system gives a plain copy.
 * Parts: separate allocations, packed BSHD [batch, seqlen, heads, d], their
 * LSE finite (every part takes part in every row) unless --inf F makes a
 * fraction F of the (row, part) pairs -inf.
 * Rows: by default the sweep below (the target: 8 parts of [1, 4096, 32,
 * 128] bf16 -> bf16, > 70% of the copy's bandwidth); --parts/--dim/--pdt/
 * --odt/--tokens/--heads/--batch pick one row instead.
 * Built as build/bench/bench_merge_bw in a CUDA build (bench/CMakeLists.txt);
 * by hand, from the repo root after the library is built into build-gpu/:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 -Iinclude \
 *        bench/merge_bw.cu build-gpu/libfattn.a -cudart static -o build-gpu/merge_bw
 * Run: build-gpu/merge_bw [--parts N] [--dim D] [--pdt bf16|f16|f32]
 *        [--odt bf16|f16|f32] [--tokens N] [--heads N] [--batch N]
 *        [--inf F] [--reps N] [--graph] [--json FILE]
 *   --graph also times the call replayed from a CUDA graph (launch cost). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "bench_cuda.h"
#include "fattn.h"


struct shape {
    int parts, batch, tokens, heads, d;
    fattn_dtype pdt, odt;
};

struct row {
    shape s;
    double merge_us, merge_gbs, copy_us, copy_gbs, graph_us;
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* N(0,1)-like values in the dtype (esz 4: f32, 2: f16 or bf16 by `bf16`) */
__global__ void fill_values(void *p, size_t n, int esz, int bf16, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float f = ((float)(z & 0xFFFFFF) / 16777216.0f - 0.5f) * 4.0f;
        if (esz == 4) ((float *)p)[i] = f;
        else if (bf16) ((uint16_t *)p)[i] = (uint16_t)(__float_as_uint(f) >> 16);
        else ((__half *)p)[i] = __float2half(f);
    }
}

/* LSE in [-4, 4), -inf with probability inf_frac */
__global__ void fill_lse(float *p, size_t n, float inf_frac, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
        z ^= z >> 29;
        const float u = (float)(z & 0xFFFFFF) / 16777216.0f, v = (float)((z >> 24) & 0xFFFFFF) / 16777216.0f;
        p[i] = v < inf_frac ? -INFINITY : 8.0f * u - 4.0f;
    }
}

static fattn_dtype parse_dt(const char *v) {
    return !strcmp(v, "f32") ? FATTN_DTYPE_F32 : !strcmp(v, "f16") ? FATTN_DTYPE_F16 : FATTN_DTYPE_BF16;
}

static row run(fattn_ctx *ctx, cudaStream_t stream, const shape &s, float inf_frac, int reps, int graph) {
    const size_t n = (size_t)s.batch * s.tokens * s.heads * s.d, nl = (size_t)s.batch * s.heads * s.tokens;
    const size_t pz = fattn_dtype_size(s.pdt), oz = fattn_dtype_size(s.odt);
    std::vector<void *> po(s.parts);
    std::vector<float *> pl(s.parts);
    std::vector<fattn_merge_part> parts(s.parts);
    for (int i = 0; i < s.parts; ++i) {
        CK(cudaMalloc(&po[i], n * pz));
        CK(cudaMalloc(&pl[i], nl * 4));
        fill_values<<<1024, 256, 0, stream>>>(po[i], n, (int)pz, s.pdt == FATTN_DTYPE_BF16, 0x1234567ull + i);
        fill_lse<<<256, 256, 0, stream>>>(pl[i], nl, inf_frac, 0x7654321ull + i);
        parts[i].o = fattn_tensor_bshd(po[i], s.pdt);
        parts[i].lse = pl[i];
    }
    void *o;
    float *lse;
    CK(cudaMalloc(&o, n * oz));
    CK(cudaMalloc(&lse, nl * 4));
    const size_t bytes = (size_t)s.parts * (n * pz + nl * 4) + n * oz + nl * 4, copy_n = bytes / 2 / 16 * 16;
    void *csrc, *cdst;
    CK(cudaMalloc(&csrc, copy_n + 16));
    CK(cudaMalloc(&cdst, copy_n + 16));
    CK(cudaMemsetAsync(csrc, 0x3C, copy_n, stream));
    CK(cudaStreamSynchronize(stream));

    fattn_merge_args a;
    memset(&a, 0, sizeof a);
    a.batch = s.batch, a.seqlen = s.tokens, a.heads = s.heads, a.head_dim = s.d;
    a.num_parts = s.parts, a.parts = parts.data();
    a.o = fattn_tensor_bshd(o, s.odt);
    a.lse = lse;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 3; ++w) {
        if (fattn_merge(ctx, &a) != FATTN_OK) {
            fprintf(stderr, "fattn_merge: %s\n", fattn_last_error(ctx));
            exit(1);
        }
        CK(cudaMemcpyAsync(cdst, csrc, copy_n, cudaMemcpyDeviceToDevice, stream));
    }
    CK(cudaStreamSynchronize(stream));
    std::vector<double> tm, tc, tg;
    for (int r = 0; r < reps; ++r) {
        tm.push_back(bench_time_us(stream, e0, e1, [&] { (void)fattn_merge(ctx, &a); }));
        tc.push_back(bench_time_us(stream, e0, e1, [&] {
            CK(cudaMemcpyAsync(cdst, csrc, copy_n, cudaMemcpyDeviceToDevice, stream));
        }));
    }
    CK(cudaGetLastError());
    row rw;
    rw.s = s;
    rw.merge_us = median(tm);
    rw.copy_us = median(tc);
    rw.merge_gbs = bytes / (rw.merge_us * 1e3);
    rw.copy_gbs = 2.0 * copy_n / (rw.copy_us * 1e3);
    rw.graph_us = 0;
    if (graph) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        const fattn_status st = fattn_merge(ctx, &a);
        CK(cudaStreamEndCapture(stream, &g));
        if (st != FATTN_OK) {
            fprintf(stderr, "fattn_merge during capture: %s\n", fattn_last_error(ctx));
            exit(1);
        }
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int r = 0; r < reps; ++r) tg.push_back(bench_time_us(stream, e0, e1, [&] { CK(cudaGraphLaunch(ge, stream)); }));
        rw.graph_us = median(tg);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    for (int i = 0; i < s.parts; ++i) {
        CK(cudaFree(po[i]));
        CK(cudaFree(pl[i]));
    }
    CK(cudaFree(o));
    CK(cudaFree(lse));
    CK(cudaFree(csrc));
    CK(cudaFree(cdst));
    return rw;
}

int main(int argc, char **argv) {
    shape one = {8, 1, 4096, 32, 128, FATTN_DTYPE_BF16, FATTN_DTYPE_BF16};
    int single = 0, reps = 30, graph = 0;
    float inf_frac = 0.0f;
    const char *json = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--graph")) {
            graph = 1;
            continue;
        }
        if (!v) k = ""; /* a flag without its value: usage */
        if (!strcmp(k, "--parts")) one.parts = atoi(v), single = 1, ++i;
        else if (!strcmp(k, "--dim")) one.d = atoi(v), single = 1, ++i;
        else if (!strcmp(k, "--pdt")) one.pdt = parse_dt(v), single = 1, ++i;
        else if (!strcmp(k, "--odt")) one.odt = parse_dt(v), single = 1, ++i;
        else if (!strcmp(k, "--tokens")) one.tokens = atoi(v), single = 1, ++i;
        else if (!strcmp(k, "--heads")) one.heads = atoi(v), single = 1, ++i;
        else if (!strcmp(k, "--batch")) one.batch = atoi(v), single = 1, ++i;
        else if (!strcmp(k, "--inf")) inf_frac = (float)atof(v), ++i;
        else if (!strcmp(k, "--reps")) reps = atoi(v), ++i;
        else if (!strcmp(k, "--json")) json = v, ++i;
        else {
            fprintf(stderr,
                    "usage: %s [--parts N] [--dim D] [--pdt bf16|f16|f32] [--odt bf16|f16|f32] [--tokens N] "
                    "[--heads N] [--batch N] [--inf F] [--reps N] [--graph] [--json FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0) != FATTN_OK) {
        fprintf(stderr, "no CUDA context: %s\n", fattn_last_error(NULL));
        return 1;
    }
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    fattn_ctx_set_stream(ctx, stream);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));

    std::vector<shape> shapes;
    if (single) {
        shapes.push_back(one);
    } else {
        const fattn_dtype B16 = FATTN_DTYPE_BF16, F32 = FATTN_DTYPE_F32;
        const int parts[] = {2, 4, 8, 16, 64};
        for (int p : parts) shapes.push_back({p, 1, 4096, 32, 128, B16, B16});
        shapes.push_back({8, 1, 4096, 32, 64, B16, B16});
        shapes.push_back({8, 1, 4096, 32, 256, B16, B16});
        shapes.push_back({8, 1, 4096, 32, 128, F32, B16});
        shapes.push_back({8, 1, 4096, 32, 128, F32, F32});
        shapes.push_back({8, 1, 4096, 32, 128, B16, F32});
        shapes.push_back({8, 4, 4096, 32, 128, B16, B16});
        shapes.push_back({256, 1, 256, 32, 128, B16, B16});
        shapes.push_back({1024, 1, 64, 32, 128, B16, B16});
    }
    printf("fattn_merge bandwidth, %s, median of %d%s; copy = cudaMemcpyAsync D2D of half the bytes\n", prop.name,
           reps, inf_frac > 0 ? ", some parts -inf" : "");
    printf("%6s %-22s %-10s %9s %10s %10s %9s %10s %7s%s\n", "parts", "[b, s, h, d]", "dtypes", "MB", "merge us",
           "merge GB/s", "copy us", "copy GB/s", "ratio", graph ? "   graph us" : "");
    std::vector<row> rows;
    for (const shape &s : shapes) {
        const row r = run(ctx, stream, s, inf_frac, reps, graph);
        rows.push_back(r);
        char sh[48], dt[24];
        snprintf(sh, sizeof sh, "[%d, %d, %d, %d]", s.batch, s.tokens, s.heads, s.d);
        snprintf(dt, sizeof dt, "%s->%s", fattn_dtype_name(s.pdt), fattn_dtype_name(s.odt));
        const double mb = r.merge_gbs * r.merge_us * 1e-3;
        printf("%6d %-22s %-10s %9.1f %10.1f %10.0f %9.1f %10.0f %7.3f", s.parts, sh, dt, mb, r.merge_us, r.merge_gbs,
               r.copy_us, r.copy_gbs, r.merge_gbs / r.copy_gbs);
        if (graph) printf(" %10.1f", r.graph_us);
        printf("\n");
        fflush(stdout);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"device\": \"%s\", \"reps\": %d, \"inf_frac\": %g, \"rows\": [\n", prop.name, reps, inf_frac);
        for (size_t i = 0; i < rows.size(); ++i) {
            const row &r = rows[i];
            fprintf(f,
                    "  {\"parts\": %d, \"batch\": %d, \"tokens\": %d, \"heads\": %d, \"d\": %d, \"pdt\": \"%s\", "
                    "\"odt\": \"%s\", \"merge_us\": %.2f, \"merge_gbs\": %.1f, \"copy_us\": %.2f, \"copy_gbs\": %.1f, "
                    "\"ratio\": %.4f, \"graph_us\": %.2f}%s\n",
                    r.s.parts, r.s.batch, r.s.tokens, r.s.heads, r.s.d, fattn_dtype_name(r.s.pdt),
                    fattn_dtype_name(r.s.odt), r.merge_us, r.merge_gbs, r.copy_us, r.copy_gbs,
                    r.merge_gbs / r.copy_gbs, r.graph_us, i + 1 < rows.size() ? "," : "");
        }
        fprintf(f, "]}\n");
        fclose(f);
    }
    fattn_ctx_free(ctx);
    return 0;
}
