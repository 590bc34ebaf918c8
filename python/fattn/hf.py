"""hf.py - fattn as an attention implementation of Hugging Face transformers.

    import fattn.hf
    fattn.hf.register()                      # once; then any model whose attention goes
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn")
                                             # through transformers' AttentionInterface

Registers `attention_forward` in transformers' AttentionInterface, and FlashAttention's
mask function in its AttentionMaskInterface, so that the model hands fattn either no mask
(causal or full attention, which fattn computes) or a 2-D padding mask [b, sk] (True =
a token; a custom implementation without a mask function would get no mask at all, padded
or not).  A padded batch is served as transformers' FlashAttention-2 integration serves it
(modeling_flash_attention_utils._upad_input): the tokens are gathered into one
flash_attn_varlen_func call with cu_seqlens from the mask, causal bottom-right aligned per
sequence, and the output is scattered back with zeros at the padded query rows.  Queries
are the last sq positions of the mask (sq == sk, or 1 in decoding, or left padding for
0 < sq < sk, the same assumption as FlashAttention-2's).  Padding-free batches (sequences
packed into one row, with no mask) are one varlen call too, their cu_seqlens from
transformers' cu_seq_lens_q/k kwargs or from position_ids that restart, as FlashAttention-2
reads them (attending across the packed sequences would be silently wrong: eager and SDPA
mask it).  A 4-D mask (a custom one),
position biases, dropout and output_attentions raise NotImplementedError.

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

    if attention_mask is not None and attention_mask.dim() != 2:
        no("a %d-D attention mask (a custom mask; fattn serves causal or full attention with "
           "transformers' 2-D padding mask)" % attention_mask.dim())
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
    variants = dict(causal=bool(is_causal), softmax_scale=scaling, window_size=window,
                    softcap=kwargs.get("softcap") or 0.0, learnable_sink=kwargs.get("s_aux"))
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    if attention_mask is not None:
        return _padded_attention(q, k, v, attention_mask, variants), None
    packed = _packed_seqlens(q, k, kwargs)
    if packed is None:
        return attention(q, k, v, **variants), None
    from . import flash_attn_varlen_func
    b = q.shape[0]
    out = flash_attn_varlen_func(*(x.reshape(-1, *x.shape[2:]) for x in (q, k, v)), *packed, **variants)
    return out.view(b, -1, *out.shape[1:]), None


def _packed_seqlens(q, k, kwargs):
    """Padding-free batches (sequences packed into one row, transformers' DataCollatorWithFlattening),
    which come with no mask: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) from the
    cu_seq_lens_q/k, max_length_q/k kwargs, else from position_ids that restart in a single row
    (FlashAttention-2's _is_packed_sequence and prepare_fa_kwargs_from_position_ids), else None."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    if all(kwargs.get(n) is not None for n in names):
        cu_q, cu_k, max_q, max_k = (kwargs[n] for n in names)
        return cu_q.int(), cu_k.int(), int(max_q), int(max_k)
    pos = kwargs.get("position_ids")
    if pos is None or q.shape[0] != 1 or q.shape[1] == 1 or q.shape[1] != k.shape[1]:
        return None
    import torch
    pos = pos.reshape(-1).to(q.device)
    if pos.shape[0] != q.shape[1] or not bool((torch.arange(pos.shape[0], device=pos.device) + pos.min() - pos).any()):
        return None  # one sequence (its positions may start past 0, as RoBERTa's)
    # each sequence restarts at the smallest position
    starts = (pos == pos.min()).nonzero().flatten().int()
    cu = torch.cat([starts, torch.tensor([pos.shape[0]], dtype=torch.int32, device=pos.device)])
    longest = int(cu.diff().max())
    return cu, cu, longest, longest


def _padded_attention(q, k, v, mask, variants):
    """q [b, sq, hq, d], k, v [b, sk, hkv, d] with a 2-D padding mask [b, sk'] (True = a token)
    as one varlen call, FlashAttention-2's _upad_input: keys are the mask's tokens, queries the
    last sq positions of the mask (every query when sq == 1, as FA2's decoding step).  Returns
    out [b, sq, hq, dv], zero at the padded query rows."""
    import torch
    from . import flash_attn_varlen_func
    b, sq = q.shape[:2]
    mask = mask.to(device=q.device, dtype=torch.bool)
    sk = mask.shape[1]
    if k.shape[1] > sk:  # a static cache, longer than the tokens seen so far: the mask says how far it is used
        k, v = k[:, :sk], v[:, :sk]
    if k.shape[1] != sk or mask.shape[0] != b or sq > sk:
        raise ValueError("fattn (attn_implementation=%r): a padding mask %s for %d queries and %d keys"
                         % (NAME, tuple(mask.shape), sq, k.shape[1]))

    def unpad(m):  # [b, s] mask -> (rows of the flattened [b * s] tokens, cu_seqlens, max_seqlen)
        lens = m.sum(-1, dtype=torch.int32)
        cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
        return m.flatten().nonzero().flatten(), cu, int(lens.max())  # .item(): FA2's too

    rows_k, cu_k, max_k = unpad(mask)
    k, v = (x.reshape(b * sk, *x.shape[2:])[rows_k] for x in (k, v))
    if sq == sk:
        rows_q, cu_q, max_q = rows_k, cu_k, max_k
    elif sq == 1:
        rows_q, cu_q, max_q = None, torch.arange(b + 1, dtype=torch.int32, device=q.device), 1
    else:  # a chunk after a cache: its tokens are the last sq of each sequence (left padding)
        rows_q, cu_q, max_q = unpad(mask[:, -sq:])
    qf = q.reshape(b * sq, *q.shape[2:])
    out = flash_attn_varlen_func(qf if rows_q is None else qf[rows_q], k, v, cu_q, cu_k, max_q, max_k,
                                 **variants)
    if rows_q is not None:
        out = out.new_zeros(b * sq, *out.shape[1:]).index_copy(0, rows_q, out)
    return out.view(b, sq, *out.shape[1:])


def register(name=NAME):
    """Make attn_implementation=name (default "fattn") available to transformers models."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
