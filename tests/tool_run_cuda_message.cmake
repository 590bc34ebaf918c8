# tool_run_cuda_message.cmake - `fattn run --backend cuda` on a machine that
# cannot serve it names the reason a newcomer can act on (issue 43 item 9):
# without an NVIDIA driver, "no NVIDIA driver found", not the CUDA runtime's
# "CUDA driver version is insufficient for CUDA runtime version"; on a GPU
# older than sm_80, "needs sm_80 or newer".  Where a GPU from sm_80 on is
# present the run itself must succeed (the Hopper or the portable engine).
#   cmake -DFATTN_CLI=<path of fattn> -P tool_run_cuda_message.cmake
execute_process(COMMAND ${FATTN_CLI} run --backend cuda --batch 1 --seqlen 128 --heads 1 --head-dim 64 --iters 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
message("${all}")
if(rc EQUAL 0)
  return()
endif()
if(all MATCHES "driver version is insufficient")
  message(FATAL_ERROR "the runtime's 'driver version is insufficient' reached the user")
endif()
if(NOT all MATCHES "no NVIDIA driver found|older than this build's CUDA runtime|no CUDA device|needs sm_80 or newer")
  message(FATAL_ERROR "no reason a user can act on in the message")
endif()
