"""fattn.compat - FlashAttention's module surfaces, served by fattn, for code written
against FlashAttention (training stacks, context-parallel engines):

    fattn.compat.flash_attn            FlashAttention-2's `flash_attn.flash_attn_interface`
                                       (also what `flash_attn` exports): flash_attn_func,
                                       flash_attn_varlen_func, flash_attn_with_kvcache with
                                       FA2's signatures, and the private _flash_attn_forward,
                                       _flash_attn_backward, _flash_attn_varlen_forward,
                                       _flash_attn_varlen_backward (ring-flash-attn, yunchang)
    fattn.compat.flash_attn_interface  FlashAttention-3's top-level `flash_attn_interface`
                                       (hopper/): _flash_attn_forward, _flash_attn_backward
                                       (TransformerEngine, yunchang's FA3 path), and FA3's
                                       public functions (fattn's own have FA3's signatures)

A caller switches by import (`from fattn.compat.flash_attn import flash_attn_func`), or,
for code that imports FlashAttention's modules itself, install() puts these modules
under FlashAttention's names in sys.modules.  Arguments whose effect fattn cannot give
(dropout, ALiBi, returned probabilities, rotary embeddings, ...) raise
NotImplementedError with a message, never ignored.  Torch tensors only.
"""
import sys

__all__ = ["install"]

_NAMES = {"fa2": ("flash_attn", "flash_attn.flash_attn_interface"), "fa3": ("flash_attn_interface",)}


def install(fa2=True, fa3=True, force=False):
    """Make `import flash_attn` / `from flash_attn.flash_attn_interface import ...`
    (fa2) and `import flash_attn_interface` (fa3) give fattn's compat modules, for
    engines that import FlashAttention by name (ring-flash-attn, yunchang).  Call it
    before those engines are imported.  A real FlashAttention module already imported
    under one of the names is kept (RuntimeError) unless force=True.  Returns the
    names installed.  Engines that check the installed *distribution* (e.g.
    TransformerEngine's importlib.metadata.version("flash-attn-3")) do not see it."""
    from . import flash_attn as fa2_mod
    from . import flash_attn_interface as fa3_mod
    want = []
    if fa2:
        want += [(n, fa2_mod) for n in _NAMES["fa2"]]
    if fa3:
        want += [(n, fa3_mod) for n in _NAMES["fa3"]]
    for name, mod in want:
        have = sys.modules.get(name)
        if have is not None and have is not mod and not force:
            raise RuntimeError("fattn.compat.install: %s is already imported (%s); pass force=True to replace it"
                               % (name, getattr(have, "__file__", have)))
    for name, mod in want:
        sys.modules[name] = mod
    if fa2:
        fa2_mod.flash_attn_interface = fa2_mod  # `import flash_attn.flash_attn_interface` then reads an attribute
    return [n for n, _ in want]
