/* quant_bw.cu - bandwidth of fattn_quantize on the GPU (the quantiser alone:
 * CUDA events around each call, median of many), next to a device-to-device
 * cudaMemcpyAsync moving the same bytes, timed interleaved with it.
 *   GB/s = (bytes read + bytes written) / median time; the quantiser reads
 *   the input once and writes the codes and scales (per tensor: the input is
 *   read twice, by the amax pass and by the codes pass; the figure still
 *   counts it once, so that the rows compare the same useful work, and
 *   "moved GB/s" counts both reads); the copy
 *   of n bytes moves 2 n, n = half the quantiser's bytes.
 * Rows: head dims 64 / 128 / 256, block scales (block_rows, 128 by default)
 * and per-tensor scales, rotation off and on; input bf16 [batch 4, 16384
 * tokens, 16 heads, d] (268 MB at d 128, several times the 50 MB L2), codes
 * packed BSHD.
 * Built as build/bench/bench_quant_bw in a CUDA build (bench/CMakeLists.txt);
 * by hand, from the repo root after the library is built into build-gpu/:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 -Iinclude -Isrc \
 *        bench/quant_bw.cu build-gpu/libfattn.a -cudart static -o build-gpu/quant_bw
 * Run: build-gpu/quant_bw [--dtype bf16|f16|f32] [--block N] [--tokens N]
 *        [--heads N] [--batch N] [--reps N] [--json FILE]
 * Prints one table; --json writes the rows too. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "bench_cuda.h"
#include "fattn.h"


struct row {
    int d, tensor, rotate;
    double quant_us, quant_gbs, moved_gbs, copy_us, copy_gbs;
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Random bits of a finite, normal-range 16-bit or f32 value (N(0,1)-like
 * magnitudes; the quantiser's speed does not depend on them). */
__global__ void fill_random(void *p, size_t n, int esz, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float f = ((float)(z & 0xFFFFFF) / 16777216.0f - 0.5f) * 4.0f;
        if (esz == 4) ((float *)p)[i] = f;
        else if (esz == 2 && (seed & 1)) ((uint16_t *)p)[i] = (uint16_t)(__float_as_uint(f) >> 16); /* bf16 */
        else ((__half *)p)[i] = __float2half(f);
    }
}

int main(int argc, char **argv) {
    fattn_dtype dt = FATTN_DTYPE_BF16;
    int block = 128, tokens = 16384, heads = 16, batch = 4, reps = 30;
    const char *json = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dtype") && v) {
            dt = !strcmp(v, "f32") ? FATTN_DTYPE_F32 : !strcmp(v, "f16") ? FATTN_DTYPE_F16 : FATTN_DTYPE_BF16;
            ++i;
        } else if (!strcmp(a, "--block") && v) block = atoi(argv[++i]);
        else if (!strcmp(a, "--tokens") && v) tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--heads") && v) heads = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--json") && v) json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--dtype bf16|f16|f32] [--block N] [--tokens N] [--heads N] [--batch N] [--reps N] [--json FILE]\n",
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
    const size_t esz = fattn_dtype_size(dt);
    const size_t max_elems = (size_t)batch * tokens * heads * 256;
    void *din, *dcopy_src, *dcopy_dst;
    uint8_t *dout;
    float *dscale;
    const size_t max_bytes = max_elems * (esz + 1) + 4 * (size_t)batch * heads * tokens;
    CK(cudaMalloc(&din, max_elems * esz));
    CK(cudaMalloc(&dout, max_elems));
    CK(cudaMalloc(&dscale, 4 * (size_t)batch * heads * tokens));
    CK(cudaMalloc(&dcopy_src, max_bytes / 2 + 16));
    CK(cudaMalloc(&dcopy_dst, max_bytes / 2 + 16));
    fill_random<<<1024, 256, 0, stream>>>(din, max_elems, (int)esz, dt == FATTN_DTYPE_BF16 ? 0x1234567ull : 0x1234566ull);
    CK(cudaMemsetAsync(dcopy_src, 0x3C, max_bytes / 2 + 16, stream));
    CK(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    printf("fattn_quantize bandwidth, %s [%d, %d, %d, d] -> e4m3, %s, median of %d; copy = cudaMemcpyAsync D2D of half the bytes\n",
           fattn_dtype_name(dt), batch, tokens, heads, prop.name, reps);
    printf("%5s %-12s %6s %10s %10s %10s %10s %10s %7s\n", "d", "scales", "rotate", "quant us", "quant GB/s", "moved GB/s",
           "copy us", "copy GB/s", "ratio");
    std::vector<row> rows;
    const int dims[3] = {64, 128, 256};
    for (int di = 0; di < 3; ++di)
        for (int tensor = 0; tensor < 2; ++tensor)
            for (int rotate = 0; rotate < 2; ++rotate) {
                const int d = dims[di];
                const size_t n = (size_t)batch * tokens * heads * d;
                const int64_t nb = (tokens + block - 1) / block;
                const size_t nscale = (size_t)batch * heads * nb;
                const size_t bytes = n * esz + n + nscale * 4, copy_n = bytes / 2 / 16 * 16;
                fattn_quantize_args a;
                memset(&a, 0, sizeof a);
                a.in = fattn_tensor_bshd(din, dt);
                a.out = fattn_tensor_bshd(dout, FATTN_DTYPE_E4M3);
                a.out.scale = dscale;
                a.batch = batch; a.seqlen = tokens; a.heads = heads; a.head_dim = d;
                a.granularity = tensor ? FATTN_QUANT_TENSOR : FATTN_QUANT_BLOCK;
                a.block_rows = block;
                a.rotate = rotate;
                a.seed = 42;
                for (int w = 0; w < 3; ++w) {
                    if (fattn_quantize(ctx, &a) != FATTN_OK) {
                        fprintf(stderr, "fattn_quantize: %s\n", fattn_last_error(ctx));
                        return 1;
                    }
                    CK(cudaMemcpyAsync(dcopy_dst, dcopy_src, copy_n, cudaMemcpyDeviceToDevice, stream));
                }
                std::vector<double> tq, tc;
                for (int r = 0; r < reps; ++r) {
                    tq.push_back(bench_time_us(stream, e0, e1, [&] { (void)fattn_quantize(ctx, &a); }));
                    tc.push_back(bench_time_us(stream, e0, e1, [&] {
                        CK(cudaMemcpyAsync(dcopy_dst, dcopy_src, copy_n, cudaMemcpyDeviceToDevice, stream));
                    }));
                }
                CK(cudaGetLastError());
                row rw;
                rw.d = d; rw.tensor = tensor; rw.rotate = rotate;
                rw.quant_us = median(tq);
                rw.copy_us = median(tc);
                rw.quant_gbs = bytes / (rw.quant_us * 1e3);
                rw.moved_gbs = (bytes + (tensor ? n * esz : 0)) / (rw.quant_us * 1e3); /* the tensor's second read */
                rw.copy_gbs = 2.0 * copy_n / (rw.copy_us * 1e3);
                rows.push_back(rw);
                char sc[32];
                snprintf(sc, sizeof sc, tensor ? "tensor" : "block %d", block);
                printf("%5d %-12s %6s %10.1f %10.0f %10.0f %10.1f %10.0f %7.3f\n", d, sc, rotate ? "yes" : "no",
                       rw.quant_us, rw.quant_gbs, rw.moved_gbs, rw.copy_us, rw.copy_gbs, rw.quant_gbs / rw.copy_gbs);
            }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"device\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, \"tokens\": %d, \"heads\": %d, \"block\": %d, "
                   "\"reps\": %d, \"rows\": [\n",
                prop.name, fattn_dtype_name(dt), batch, tokens, heads, block, reps);
        for (size_t i = 0; i < rows.size(); ++i)
            fprintf(f,
                    "  {\"d\": %d, \"scales\": \"%s\", \"rotate\": %d, \"quant_us\": %.2f, \"quant_gbs\": %.1f, "
                    "\"moved_gbs\": %.1f, \"copy_us\": %.2f, \"copy_gbs\": %.1f, \"ratio\": %.4f}%s\n",
                    rows[i].d, rows[i].tensor ? "tensor" : "block", rows[i].rotate, rows[i].quant_us, rows[i].quant_gbs,
                    rows[i].moved_gbs, rows[i].copy_us, rows[i].copy_gbs, rows[i].quant_gbs / rows[i].copy_gbs,
                    i + 1 < rows.size() ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    fattn_ctx_free(ctx);
    return 0;
}
