#!/usr/bin/env bash
# the GPU tests of command 1a on HEAD (after the audit fixes), then memcheck of the self-checked ops
L=$OUT/call5.log
R=$(pwd -P)
cd .ab/new9 || exit 1
export SWA_COMMIT=99ed6f9; . bench/gpu_env.sh >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 420 python3 -m pytest -q -m gpu tests/backends tests/dispatch tests/e2e tests/entry_points tests/kernels/test_sanitize_gpu.py -x > $OUT/gpu_tests_1a.log 2>&1; step tests_1a $?
tail -15 $OUT/gpu_tests_1a.log >> $L
S=$(mktemp -d); (cd $S && python3 -m zipfile -e $R/.sanitizer/*.whl . && chmod -R u+x nvidia/cu13/bin nvidia/cu13/compute-sanitizer)
PATH=$S/nvidia/cu13/bin:$PATH PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $((560-$(date +%s)+t0)) compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py --self-checked-only > $OUT/sanitizer_self_checked.txt 2>&1; step memcheck $?
tail -3 $OUT/sanitizer_self_checked.txt >> $L
