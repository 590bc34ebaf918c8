"""hf.py - fattn as an attention implementation of Hugging Face transformers.

    import fattn.hf
    fattn.hf.register()                      # once; then any model whose attention goes
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn")
                                             # through transformers' AttentionInterface

Registers `attention_forward` in transformers' AttentionInterface, and FlashAttention's
mask function in its AttentionMaskInterface, so that the model hands fattn either no mask
(causal or full attention, which fattn computes) or a 2-D padding mask, which fattn
refuses with NotImplementedError rather than ignoring (a custom implementation without a
mask function would get no mask at all, padded or not).  Position biases and dropout raise
NotImplementedError too.

The variants the models pass to their attention interface are served, forward and
backward: `sliding_window` (Mistral, Gemma 2, gpt-oss: a key is seen by the last
sliding_window positions up to the query, transformers' sliding_window_overlay, so
window_size (sliding_window - 1, sliding_window - 1) as transformers' flash-attention
path passes it, with the causal mask), `softcap` (Gemma 2's attn_logit_softcapping) and
`s_aux` (gpt-oss's sinks: fattn's learnable_sink, whose gradient reaches the parameter).
"""
NAME = "fattn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention signature: query [b, hq, sq, d], key/value [b, hkv, sk, d]
    (not repeated for GQA); returns (out [b, sq, hq, dv], None)."""
    from . import attention

    def no(what):
        raise NotImplementedError("fattn (attn_implementation=%r): %s is not supported" % (NAME, what))

    if attention_mask is not None:
        no("an attention mask (padding, or a custom 4-D mask); pass unpadded batches")
    if dropout:
        no("attention dropout (%r)" % (dropout,))
    if kwargs.get("position_bias") is not None:
        no("position_bias")
    if kwargs.get("output_attentions"):
        no("output_attentions=True")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # Under autocast, SDPA gets its inputs cast to the autocast dtype, and some models rely on
    # it (Llama's rotary embedding leaves q and k in fp32 with v in bf16): do the same.
    dev = query.device.type
    import torch
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        query, key, value = (x.to(dt) for x in (query, key, value))
    # [b, h, s, d] -> [b, s, h, d] views: the head dim stays contiguous, nothing is copied.
    # fattn's causal mask is bottom-right aligned, as transformers' with a KV cache: the
    # queries are the last sq positions of the sk keys.
    sliding_window = kwargs.get("sliding_window")
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    out = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=bool(is_causal),
                    softmax_scale=scaling, window_size=window, softcap=kwargs.get("softcap") or 0.0,
                    learnable_sink=kwargs.get("s_aux"))
    return out, None


def register(name=NAME):
    """Make attn_implementation=name (default "fattn") available to transformers models."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
