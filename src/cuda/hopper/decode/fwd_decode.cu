/* fwd_decode.cu - the decoding forward's 16-bit instances (fwd_decode.cuh;
 * host side in fwd_decode_launch.cuh, the FP8 cache's instances in
 * fwd_decode_kv8.cu) and which problems take the kernel. */
#include "fwd_decode_launch.cuh"

bool fwd_decode_eligible(const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    if (a->q.dtype == FATTN_DTYPE_E4M3 || p->cu_seqlens_q || p->cu_seqlens_k) return false;
    /* its instances (fwd_decode_launch); 96 and 192 take the main kernels */
    if (p->head_dim != p->head_dim_v || (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)) return false;
    const int group = p->heads_q / p->heads_kv;
    return p->seqlen_q <= FWD_DECODE_MAX_SEQLEN_Q && (int64_t)group * p->seqlen_q <= fwd_decode_max_rows_of(a);
}

fattn_status fwd_decode_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    return decode_launch<false>(ctx, a, v);
}
