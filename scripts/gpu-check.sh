#!/usr/bin/env bash
# gpu-check.sh LOGDIR [quick|causal|full|nobench] [PARTS]
# On a machine with a Hopper GPU: build what is missing, check the kernels'
# resources and SASS, run the GPU tests, compute-sanitizer on small shapes, and
# the side-by-side benchmark.  Logs land in LOGDIR (at most 8 files).
# PARTS (default all) is a comma list of ptxas, tests, sanitizer (or one of
# memcheck, racecheck, synccheck) and bench.  The whole check takes longer than
# one 10-minute device call, so it can run as several calls, each of which
# builds first; a part's failure still sets the exit status.
# The GPU tests run with FATTN_REQUIRE_GPU=1: here a test that would skip (no
# device, an unsupported one, a broken driver) fails, and so does any test
# ctest still reports as skipped.  The exit status is 1 when a test, the
# fattn-vs-cuDNN table or a sanitizer run failed.
set -u
export FATTN_REQUIRE_GPU=1
failed=0
LOG=${1:?usage: scripts/gpu-check.sh LOGDIR [quick|causal|full|nobench] [ptxas,tests,sanitizer,bench]}
MODE=${2:-full}
PARTS=${3:-all}
want() { [ "$PARTS" = all ] || case ",$PARTS," in *",$1,"*) true ;; *) false ;; esac; }
mkdir -p "$LOG"
cd "$(dirname "$0")/.."
BUILD=${FATTN_GPU_BUILD:-build-gpu}
step() { echo "== $* ($(date +%T))" | tee -a "$LOG/summary.txt"; }

step build
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" -j"$(nproc)"; } >"$LOG/build.log" 2>&1 \
  || { tail -40 "$LOG/build.log"; echo "BUILD FAILED" | tee -a "$LOG/summary.txt"; exit 1; }

if want ptxas; then
step "resources (ptxas) and SASS"
rm -f "$LOG/ptxas.txt"
{
  # every kernel file, in parallel (one nvcc per core), each file's lines kept together
  find src/cuda -name "*.cu" | sort | xargs -P "$(nproc)" -I{} sh -c \
    'nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 --use_fast_math -DFATTN_WITH_CUDA=1 -Iinclude -Isrc \
       -Isrc/cuda -Xptxas=-v,--warn-on-spills -c {} -o /dev/null >/tmp/ptxas.$$.txt 2>&1;
     { echo "--- {}"; grep -E "Used|spill|warn|C75|error" /tmp/ptxas.$$.txt; } > "$0/ptxas.$(basename {}).part"; rm -f /tmp/ptxas.$$.txt' "$LOG"
  for f in "$LOG"/ptxas.*.part; do cat "$f" >>"$LOG/ptxas.txt"; rm -f "$f"; done
  grep -E "spill" "$LOG/ptxas.txt" | sort | uniq -c
  echo "SASS instruction counts in libfattn:"
  cuobjdump -sass "$BUILD/libfattn.so" >"$LOG/lib.sass"
  grep -oE "HGMMA\.[0-9x]+\.F32(\.BF16)?|QGMMA\.[0-9x]+\.F32\.E4M3\.E4M3|UTMALDG\.[0-9]D|UTMASTG\.[0-9]D|STSM\.[0-9A-Z.]+|USETMAXREG\.[A-Z.]+" "$LOG/lib.sass" | sort | uniq -c
  echo "key-block loops (scripts/sass_loops.py):"
  python3 scripts/sass_loops.py "$LOG/lib.sass"
  echo "main-loop rules (scripts/sass_check.py):"
  python3 scripts/sass_check.py "$LOG/lib.sass"; echo "sass_check rc=$?"
  rm -f "$LOG/lib.sass"
} >"$LOG/sass.txt" 2>&1
cat "$LOG/sass.txt" | tail -12
# the backward's consumer loops: no generic loads or stores, dP^T's wait below the exponentials
if ! grep -q "sass_check rc=0" "$LOG/sass.txt"; then
  echo "sass_check: a backward main loop breaks a rule (see $LOG/sass.txt)" | tee -a "$LOG/summary.txt"
  failed=1
fi
# the project's claim: no shipped kernel spills (issue 27 item 9)
if grep -qE "[1-9][0-9]* bytes spill (stores|loads)" "$LOG/ptxas.txt"; then
  echo "ptxas: a shipped kernel spills (see $LOG/ptxas.txt)" | tee -a "$LOG/summary.txt"
  failed=1
fi
fi

if want tests; then
step "GPU tests"
# four at a time on the one GPU (correctness only: no test times anything); the
# fattn-vs-cuDNN table runs once, below, where its output is kept
( cd "$BUILD" && timeout 900 ctest -j 4 -L gpu -E gpu_test_vs_cudnn --output-on-failure ) >"$LOG/tests.log" 2>&1
rc=$?; grep -E "tests passed|Passed|Failed|FAIL|Skipped|\*\*\*" "$LOG/tests.log" | tail -25
echo "ctest gpu rc=$rc" | tee -a "$LOG/summary.txt"
if grep -qE "Skipped|Not Run" "$LOG/tests.log"; then
  echo "ctest gpu: a test was skipped or not run on the GPU host" | tee -a "$LOG/summary.txt"
  rc=1
fi
[ "$rc" -eq 0 ] || failed=1
echo "--- fattn vs cuDNN error table (tests/gpu/test_vs_cudnn.py)" >>"$LOG/tests.log"
FATTN_LIBRARY="$PWD/$BUILD/libfattn.so" python3 tests/gpu/test_vs_cudnn.py >>"$LOG/tests.log" 2>&1
rc=$?; echo "test_vs_cudnn rc=$rc" | tee -a "$LOG/summary.txt"
grep -E "^WARNING" "$LOG/tests.log" | tee -a "$LOG/summary.txt"
[ "$rc" -eq 0 ] || failed=1
fi

if want sanitizer || want memcheck || want racecheck || want synccheck; then
step "compute-sanitizer (small shapes)"
{
  for tool in memcheck racecheck synccheck; do
    want sanitizer || want $tool || continue
    for t in gpu_test_fwd gpu_test_fwd_fp8 gpu_test_bwd gpu_test_bwd_hdims gpu_test_varlen gpu_test_kvcache_prefill gpu_test_decode gpu_test_fwd_variants gpu_test_bwd_variants; do
      echo "--- $tool $t"
      FATTN_TEST_SMALL=1 timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/$t" 2>&1 | tail -6
      echo "$tool $t rc=${PIPESTATUS[0]}"
    done
    # the portable engine (issue 41), forced on this GPU: its own test, and
    # the varlen forward and backward and the backward tests through it
    echo "--- $tool gpu_test_portable_fwd"
    FATTN_TEST_SMALL=1 timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/gpu_test_portable_fwd" 2>&1 | tail -6
    echo "$tool gpu_test_portable_fwd rc=${PIPESTATUS[0]}"
    echo "--- $tool gpu_test_varlen (FATTN_CUDA_ENGINE=portable)"
    FATTN_CUDA_ENGINE=portable FATTN_TEST_SMALL=1 timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/gpu_test_varlen" 2>&1 | tail -6
    echo "$tool gpu_test_varlen portable rc=${PIPESTATUS[0]}"
    for t in gpu_test_bwd gpu_test_bwd_hdims; do
      echo "--- $tool $t (FATTN_CUDA_ENGINE=portable)"
      FATTN_CUDA_ENGINE=portable FATTN_TEST_SMALL=1 timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/$t" 2>&1 | tail -6
      echo "$tool $t portable rc=${PIPESTATUS[0]}"
    done
  done
  if { want sanitizer || want racecheck; } && [ -x "$BUILD/tests/gpu_test_primitives" ]; then
    echo "--- racecheck primitives"
    timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/gpu_test_primitives" 2>&1 | tail -40
  fi
} >"$LOG/sanitizer.log" 2>&1
grep -E "rc=|ERROR SUMMARY" "$LOG/sanitizer.log" | tee -a "$LOG/summary.txt"
grep -qE "rc=[1-9]" "$LOG/sanitizer.log" && failed=1
fi

if [ "$MODE" = nobench ] || ! want bench; then
  [ "$failed" -eq 0 ] || echo "gpu-check: FAILED (see $LOG/summary.txt)"
  exit $failed
fi

step benchmark
export PYTHONUNBUFFERED=1 FATTN_LIBRARY="$PWD/$BUILD/libfattn.so"
if [ "$MODE" = causal ]; then
  timeout 500 python3 bench/compare.py --clocks --causal 1 \
    --json "$LOG/compare.json" --png "$LOG/compare.png" >"$LOG/compare.log" 2>&1
elif [ "$MODE" = quick ]; then
  timeout 500 python3 bench/compare.py --clocks --dtypes bf16 --seqlens 1024,4096,8192 --ablation \
    --json "$LOG/compare.json" --png "$LOG/compare.png" >"$LOG/compare.log" 2>&1
else
  timeout 900 python3 bench/compare.py --clocks --ablation --json "$LOG/compare.json" --png "$LOG/compare.png" >"$LOG/compare.log" 2>&1
fi
echo "compare rc=$?" | tee -a "$LOG/summary.txt"
cat "$LOG/compare.log"
[ "$failed" -eq 0 ] || echo "gpu-check: FAILED (see $LOG/summary.txt)"
exit $failed
