"""fattn as transformers' attn_implementation="fattn" (fattn/hf.py): small random Llama
(GQA) and GPT-2 models on the CPU give the logits, gradients and greedy generations of
attn_implementation="sdpa"; small random Mistral (sliding window), Gemma 2 (sliding window
and logit softcapping) and gpt-oss (sliding window and learnable sinks) models those of
"eager"; padded batches (left and right, a KV cache, generate) and sequences packed in a row
those of "eager" on their tokens; what fattn cannot serve (custom 4-D masks, output_attentions)
raises.  The models are built from configs in code (no download).  Needs torch, transformers and the library."""
import inspect
import unittest

import _path  # noqa: F401
import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

import fattn
import fattn.hf

CALLS = []


def counted(module, query, *args, **kwargs):
    CALLS.append(tuple(query.shape))
    VARIANT_KWARGS.append({n: kwargs.get(n) for n in ("sliding_window", "softcap", "s_aux")})
    return fattn.hf.attention_forward(module, query, *args, **kwargs)


VARIANT_KWARGS = []


def llama():
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def gpt2():
    return GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)


# Variant models: 2 layers, GQA 4/2, head dim 16 (64 on the GPU), a sliding window of 8 keys on 40-token inputs, and a
# larger initializer_range than the default 0.02 so that the scores are large enough (|s| up to ~10)
# for the softcap and the window to change the logits (checked: test_variants_matter).
def mistral(head_dim=16):
    from transformers import MistralConfig
    return MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, sliding_window=8,
                         max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)


def gemma2(head_dim=16):
    from transformers import Gemma2Config
    # layer 0 sliding, layer 1 global (Gemma 2's alternation); softcap 5 on scores of |s| ~ 10
    return Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, sliding_window=8,
                        query_pre_attn_scalar=head_dim, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                        max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2)


def gpt_oss(head_dim=16):
    from transformers import GptOssConfig
    # layer 0 sliding, layer 1 full; sinks drawn N(0, 1) in variant_model (the init leaves them near 0); every
    # token to both experts: a top-k choice that bf16 rounding flips moves a logit by ~1-2 (measured with 2 of
    # 4 experts), far above the attention's bf16 noise this compares
    return GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, num_local_experts=2,
                        num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                        max_position_embeddings=131072, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2)


VARIANT_MODELS = (mistral, gemma2, gpt_oss)


class Transformers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fattn.hf.register()
        fattn.hf.register("fattn_counted")
        transformers.AttentionInterface.register("fattn_counted", counted)

    def model(self, cfg, impl, dtype=torch.float32):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=dtype)

    def test_logits_match_sdpa(self):
        ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(1))
        for make in (llama, gpt2):
            with torch.no_grad():
                f32 = self.model(make(), "sdpa").eval()(ids).logits
                CALLS.clear()
                got32 = self.model(make(), "fattn_counted").eval()(ids).logits
                self.assertEqual(len(CALLS), 2, "one fattn call per layer")
                want = self.model(make(), "sdpa", torch.bfloat16).eval()(ids).logits.float()
                got = self.model(make(), "fattn", torch.bfloat16).eval()(ids).logits.float()
            # f32: both compute in f32 (measured max |diff| ~2e-7)
            self.assertLess((got32 - f32).abs().max().item(), 1e-5, make.__name__)
            # bf16 noise: fattn's bf16 model no further from the f32 model than 1.5x SDPA's bf16
            # model is (measured: fattn 0.98-1.0x SDPA's, max |diff| ~4e-3, mean ~7e-4)
            for stat in (torch.max, torch.mean):
                self.assertLessEqual(stat((got - f32).abs()).item(), 1.5 * stat((want - f32).abs()).item(),
                                     (make.__name__, stat.__name__))

    def test_gradients_match_sdpa(self):
        ids = torch.randint(3, 128, (2, 32), generator=torch.Generator().manual_seed(2))
        grads = []
        for impl in ("sdpa", "fattn"):
            m = self.model(llama(), impl)
            m(ids, labels=ids).loss.backward()
            grads.append({n: p.grad for n, p in m.named_parameters()})
        for n, g in grads[0].items():
            torch.testing.assert_close(grads[1][n], g, rtol=1e-4, atol=1e-6, msg=n)

    def test_autocast_mixed_dtypes(self):
        # Llama's rotary embedding hands fp32 q, k and a bf16 v to the attention under autocast;
        # SDPA's inputs are cast by autocast, fattn's by hf.py: the losses then agree in bf16
        ids = torch.randint(3, 128, (2, 32), generator=torch.Generator().manual_seed(4))
        losses = []
        for impl in ("sdpa", "fattn"):
            m = self.model(llama(), impl)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                losses.append(m(ids, labels=ids).loss.float().item())
        self.assertLess(abs(losses[1] - losses[0]), 2e-2 * abs(losses[0]), losses)

    def test_generate_with_cache(self):
        ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(3))
        outs = [self.model(llama(), impl).generate(ids, max_new_tokens=10, do_sample=False)
                for impl in ("sdpa", "fattn")]
        self.assertTrue(torch.equal(outs[0], outs[1]))

    def test_dropout_is_refused(self):
        m = self.model(gpt2(), "fattn").train()  # GPT-2's attention dropout is 0.1 in training
        with self.assertRaises(NotImplementedError):
            m(torch.randint(3, 128, (1, 8)))

    def variant_model(self, make, impl, dtype=torch.float32):
        m = self.model(make(), impl, dtype)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith(".sinks"):  # gpt-oss: sinks of either sign, as trained ones
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)).to(p.dtype))
        return m.eval()

    def test_variant_logits_match_eager(self):
        ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(5))
        for make in VARIANT_MODELS:
            name = make.__name__
            with torch.no_grad():
                f32 = self.variant_model(make, "eager")(ids).logits
                CALLS.clear()
                VARIANT_KWARGS.clear()
                got32 = self.variant_model(make, "fattn_counted")(ids).logits
                want = self.variant_model(make, "eager", torch.bfloat16)(ids).logits.float()
                got = self.variant_model(make, "fattn", torch.bfloat16)(ids).logits.float()
            self.assertEqual(len(CALLS), 2, name)
            # the variants reached fattn: layer 0's window, Gemma 2's softcap, gpt-oss's sinks
            self.assertEqual(VARIANT_KWARGS[0]["sliding_window"], 8, name)
            self.assertEqual(VARIANT_KWARGS[0]["softcap"], 5.0 if make is gemma2 else None, name)
            self.assertEqual(VARIANT_KWARGS[0]["s_aux"] is not None, make is gpt_oss, name)
            # f32: both compute in f32
            self.assertLess((got32 - f32).abs().max().item(), 1e-4 * f32.abs().max().item(), name)
            # bf16 noise: fattn's bf16 model no further from the f32 model than 1.5x eager's bf16 model
            # (measured on three inputs: max |diff| 0.5-1.07x eager's, mean 0.9-1.0x; f32: <= 1e-5)
            for stat in (torch.max, torch.mean):
                self.assertLessEqual(stat((got - f32).abs()).item(), 1.5 * stat((want - f32).abs()).item(),
                                     (name, stat.__name__))

    def test_variants_matter(self):
        # the checks above would pass if fattn ignored a variant only if it changed nothing: without the
        # window, the softcap or the sinks the logits move far beyond the tolerances used there
        ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(5))
        for make, drop in ((mistral, dict(sliding_window=None)), (gemma2, dict(attn_logit_softcapping=None)),
                           (gpt_oss, None)):
            with torch.no_grad():
                m = self.variant_model(make, "eager")
                want = m(ids).logits
                if drop is None:
                    for n, p in m.named_parameters():
                        if n.endswith(".sinks"):
                            p.fill_(-float("inf"))  # no sink
                else:
                    for k, val in drop.items():  # read at each call: Mistral's from the config, Gemma 2's from
                        setattr(m.config, k, val)  # the attention module
                        for layer in m.model.layers:
                            if hasattr(layer.self_attn, k):
                                setattr(layer.self_attn, k, val)
                other = m(ids).logits
            self.assertGreater((other - want).abs().max().item(), 1e-2 * want.abs().max().item(), make.__name__)

    def test_variant_gradients_match_eager(self):
        # training: d(sinks) of gpt-oss through fattn_bwd's dsink, the window and softcap's backward
        ids = torch.randint(3, 128, (2, 32), generator=torch.Generator().manual_seed(6))
        for make in VARIANT_MODELS:
            grads = []
            for impl in ("eager", "fattn"):
                m = self.variant_model(make, impl).train()
                m(ids, labels=ids).loss.backward()
                grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
            self.assertEqual(sorted(grads[0]), sorted(grads[1]), make.__name__)
            if make is gpt_oss:
                self.assertTrue(any(n.endswith(".sinks") for n in grads[1]))
            for n, g in grads[0].items():
                torch.testing.assert_close(grads[1][n], g, rtol=1e-3, atol=1e-5, msg=lambda m: "%s %s: %s"
                                           % (make.__name__, n, m))

    def test_variant_generate_with_cache(self):
        # greedy decoding past the window (12 + 10 tokens, window 8): the cache's keys, bottom-right aligned
        ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(7))
        for make in VARIANT_MODELS:
            outs = [self.variant_model(make, impl).generate(ids, max_new_tokens=10, do_sample=False)
                    for impl in ("eager", "fattn")]
            self.assertTrue(torch.equal(outs[0], outs[1]), make.__name__)

    def padded(self, side, lens=(12, 7, 3), s=12):
        ids = torch.randint(3, 128, (len(lens), s), generator=torch.Generator().manual_seed(10))
        mask = torch.zeros_like(ids)
        for i, n in enumerate(lens):
            mask[i, s - n:] = 1 if side == "left" else 0
            mask[i, :n] = 1 if side == "right" else mask[i, :n]
        return ids * mask, mask  # pad_token_id 0 at the pads

    def test_padded_logits_match_eager(self):
        # left and right padding, one sequence unpadded: the tokens of each sequence as one varlen call
        # (fattn.hf._padded_attention), compared on the tokens; eager computes the same f32 sums masked
        for side in ("left", "right"):
            ids, mask = self.padded(side)
            tok = mask.bool()
            with torch.no_grad():
                want = self.model(llama(), "eager").eval()(ids, attention_mask=mask).logits
                CALLS.clear()
                got = self.model(llama(), "fattn_counted").eval()(ids, attention_mask=mask).logits
                unmasked = self.model(llama(), "eager").eval()(ids).logits
            self.assertEqual(len(CALLS), 2, side)
            # measured max |diff| ~1.5e-7 on logits of |x| <= 0.7
            self.assertLess((got - want)[tok].abs().max().item(), 1e-5, side)
            # left padding: ignoring the mask would move the tokens' logits far beyond that (right padding: a
            # causal token sees no pad)
            if side == "left":
                self.assertGreater((unmasked - want)[tok].abs().max().item(), 1e-2)

    def test_padded_chunk_after_cache(self):
        # 3 new tokens after a left-padded prefill: queries the last 3 of 15 mask positions, bottom-right
        # aligned on each sequence's own keys (the branch between prefill's sq == sk and decoding's sq == 1)
        ids, mask = self.padded("left")
        more = torch.randint(3, 128, (3, 3), generator=torch.Generator().manual_seed(11))
        mask2 = torch.cat([mask, torch.ones_like(more)], 1)
        logits = []
        for impl in ("eager", "fattn"):
            m = self.model(llama(), impl).eval()
            # transformers 5.2x names the argument cache; earlier ones past_key_values (then `cache` is ignored)
            kw = "cache" if "cache" in inspect.signature(m.forward).parameters else "past_key_values"
            with torch.no_grad():
                cache = transformers.DynamicCache(config=m.config)
                m(ids, attention_mask=mask, use_cache=True, **{kw: cache})
                logits.append(m(more, attention_mask=mask2, use_cache=True, **{kw: cache}).logits)
        self.assertLess((logits[1] - logits[0]).abs().max().item(), 1e-5)

    def test_padded_generate_matches_eager(self):
        # a batched, left-padded greedy generate: prefill unpadded, then one query per sequence against
        # the cache's keys of that sequence (the mask says which); a static cache is longer than the mask
        ids, mask = self.padded("left")
        for cache in (None, "static"):
            kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, cache_implementation=cache)
            want = self.model(llama(), "eager").generate(ids, **kw)
            CALLS.clear()
            got = self.model(llama(), "fattn_counted").generate(ids, **kw)
            self.assertIn((3, 4, 1, 16), CALLS, cache)  # decoding steps reached fattn
            self.assertTrue(torch.equal(got, want), (cache, got, want))

    def test_padded_gradients_match_eager(self):
        # training on a right-padded batch (labels -100 at the pads): the varlen call's backward
        ids, mask = self.padded("right", (16, 11, 5), 16)
        labels = ids.masked_fill(mask == 0, -100)
        grads = []
        for impl in ("eager", "fattn"):
            m = self.model(llama(), impl)
            m(ids, attention_mask=mask, labels=labels).loss.backward()
            grads.append({n: p.grad for n, p in m.named_parameters()})
        for n, g in grads[0].items():
            torch.testing.assert_close(grads[1][n], g, rtol=1e-4, atol=1e-6, msg=n)

    def test_packed_logits_match_eager(self):
        # padding-free: 3 sequences packed into one row, no mask (DataCollatorWithFlattening); eager masks
        # across them from the restarting position_ids (without a cache), fattn takes cu_seqlens from them
        # or from the cu_seq_lens_q/k kwargs
        ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(12))
        pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
        cu = torch.tensor([0, 5, 8, 12], dtype=torch.int32)
        with torch.no_grad():
            want = self.model(llama(), "eager").eval()(ids, position_ids=pos, use_cache=False).logits
            fa = self.model(llama(), "fattn").eval()
            got = fa(ids, position_ids=pos, use_cache=False).logits
            got_cu = fa(ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5,
                        max_length_k=5).logits
            across = self.model(llama(), "sdpa").eval()(ids, position_ids=pos).logits  # a cache: no packing
        self.assertLess((got - want).abs().max().item(), 1e-5)
        self.assertLess((got_cu - want).abs().max().item(), 1e-5)
        self.assertGreater((across - want).abs().max().item(), 1e-2)  # attending across would be far off

    def test_refused(self):
        ids, mask = self.padded("left")
        m = self.model(llama(), "fattn").eval()
        with torch.no_grad():
            with self.assertRaisesRegex(NotImplementedError, "output_attentions"):
                m(ids, attention_mask=mask, output_attentions=True)
            custom = torch.zeros(3, 1, 12, 12).masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -1e9)
            with self.assertRaisesRegex(NotImplementedError, "4-D attention mask"):  # passed through as it is
                m(ids, attention_mask=custom)
            m(ids, attention_mask=torch.ones_like(mask))  # an all-ones mask is no mask


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@unittest.skipUnless(HOPPER, "needs a Hopper GPU (the variants run on the Hopper engine's kernels)")
class VariantsCuda(unittest.TestCase):
    """The tiny Mistral, Gemma 2 and gpt-oss models on the GPU (issue 37): fattn's CUDA kernels (window,
    softcap, sinks; bf16 and fp16, which the CUDA engine takes) against transformers' eager attention on the
    same GPU, with eager in float32 as the reference: fattn's bf16 logits no further from it than 1.5x
    eager's bf16 model (max and mean, as on the CPU), its bf16 gradients within 2x eager's bf16 error plus
    1e-3 of the f32 gradient's norm, and fp16 greedy generation past the window token for token."""

    @classmethod
    def setUpClass(cls):
        fattn.hf.register()

    def model(self, make, impl, dtype):
        torch.manual_seed(0)
        # head dim 64: the Hopper kernels' smallest (the CPU classes' 16 is refused there)
        m = AutoModelForCausalLM.from_config(make(head_dim=64), attn_implementation=impl, dtype=dtype).cuda()
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith(".sinks"):  # as Transformers.variant_model
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)).to(p.dtype))
        return m.eval()

    def test_logits_match_eager(self):
        ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(5)).cuda()
        for make in VARIANT_MODELS:
            with torch.no_grad():
                f32 = self.model(make, "eager", torch.float32)(ids).logits
                want = self.model(make, "eager", torch.bfloat16)(ids).logits.float()
                got = self.model(make, "fattn", torch.bfloat16)(ids).logits.float()
            for stat in (torch.max, torch.mean):
                self.assertLessEqual(stat((got - f32).abs()).item(), 1.5 * stat((want - f32).abs()).item(),
                                     (make.__name__, stat.__name__))

    def test_gradients_match_eager(self):
        ids = torch.randint(3, 128, (2, 32), generator=torch.Generator().manual_seed(6)).cuda()
        for make in VARIANT_MODELS:
            grads = {}
            for impl, dt in (("eager", torch.float32), ("eager", torch.bfloat16), ("fattn", torch.bfloat16)):
                m = self.model(make, impl, dt).train()
                m(ids, labels=ids).loss.backward()
                grads[impl, dt] = {n: p.grad.float() for n, p in m.named_parameters() if p.grad is not None}
            ref, eager = grads["eager", torch.float32], grads["eager", torch.bfloat16]
            got = grads["fattn", torch.bfloat16]
            self.assertEqual(sorted(got), sorted(ref), make.__name__)
            for n, g in ref.items():
                err, peer = (got[n] - g).norm().item(), (eager[n] - g).norm().item()
                self.assertLessEqual(err, 2 * peer + 1e-3 * g.norm().item(), "%s %s" % (make.__name__, n))

    def test_generate_matches_eager(self):
        ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(7)).cuda()
        for make in VARIANT_MODELS:
            outs = [self.model(make, impl, torch.float16).generate(ids, max_new_tokens=10, do_sample=False)
                    for impl in ("eager", "fattn")]
            self.assertTrue(torch.equal(outs[0], outs[1]), make.__name__)


if __name__ == "__main__":
    unittest.main()
