"""prepare.py FA_CHECKOUT OUT_DIR: copy FlashAttention-3's hopper/test_flash_attn.py, test_util.py and
padding.py from a git checkout of Dao-AILab/flash-attention into OUT_DIR (an ignored folder: FA3's
files are never committed here) with this folder's shim and hooks, and make each test run its
head-dim-equal dv and attention_chunk 0 first (README.md says why; the random draws are unchanged)."""
import os
import shutil
import subprocess
import sys

LOOP = "    for dv, attention_chunk in itertools.product(dv_vals, attention_chunk_vals):"
FIRST = ("    dv_vals = sorted(dv_vals, key=lambda x: x != d)\n"
         "    attention_chunk_vals = sorted(attention_chunk_vals, key=lambda x: x != 0)\n")


def main(checkout, out):
    os.makedirs(out, exist_ok=True)
    for name in ("test_flash_attn.py", "test_util.py", "padding.py"):
        text = subprocess.run(["git", "-C", checkout, "show", "HEAD:hopper/" + name], check=True,
                              capture_output=True, text=True).stdout
        if name == "test_flash_attn.py":
            if LOOP not in text:
                sys.exit("prepare.py: FA3's test loop is not where this script expects it; check by hand")
            text = text.replace(LOOP, FIRST + LOOP)
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("flash_attn_interface.py", "conftest.py"):
        shutil.copy(os.path.join(here, name), out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
