#!/bin/bash
# ncu_fp8.sh BINARY [ARGS...] - one launch of a Hopper forward kernel under
# Nsight Compute with the stall reasons (perf-notes f2: the FP8 kernels are
# latency-bound; which stalls dominate is the next question).  Clocks are left
# as they are (--clock-control none: the machine's settings are not ours).
#   bench/ncu_fp8.sh /tmp/fv/fp8v128 16384     (bench/fp8_variants.cu, first variant)
set -u
out=${OUT:-.}/ncu-fp8
ncu --clock-control none -k regex:fwd_sm90 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section SourceCounters \
    --metrics smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_sleeping,smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_selected,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_no_instructions,smsp__pcsamp_warps_issue_stalled_branch_resolving \
    -o "$out" -f "$@" > /dev/null 2>&1 ||
  # a metric name this ncu does not know fails the whole run: the sections alone then
  ncu --clock-control none -k regex:fwd_sm90 -c 1 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters -o "$out" -f "$@" > /dev/null 2>&1
ncu -i "$out.ncu-rep" --page details --print-details all 2>&1 | grep -v "^==PROF==" | head -200
ncu -i "$out.ncu-rep" --page source --csv --print-source sass 2>/dev/null | head -400 > "$out-sass.csv"
