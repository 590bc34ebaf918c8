/* fwd_decode_kv8.cu - the decoding forward's FP8-cache instances (e4m3 K
 * and V with 16-bit q, DecCfg::KV8, fattn.h 0.5), a file of their own so
 * that they compile beside the 16-bit ones; host side in
 * fwd_decode_launch.cuh. */
#include "fwd_decode_launch.cuh"

fattn_status fwd_decode_kv8_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    return decode_launch<true>(ctx, a, v);
}
