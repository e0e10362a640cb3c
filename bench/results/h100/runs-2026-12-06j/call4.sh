#!/usr/bin/env bash
# GPU tests of the forms that screen their own calls, and memcheck of every self-checked form
L=$OUT/call4.log
ROOT=$(pwd -P)
cd .ab/new || exit 1
export SWA_COMMIT=$NEW_COMMIT; . bench/gpu_env.sh >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 330 python3 -m pytest -q -m gpu tests/dispatch tests/e2e tests/kernels/test_triton_gpu.py -k "not warmup_then_serving" -p no:cacheprovider > $OUT/gpu_tests.log 2>&1; step gpu_tests $?
tail -15 $OUT/gpu_tests.log >> $L
S=$(mktemp -d); (cd $S && python3 -m zipfile -e $ROOT/.sanitizer/*.whl . && chmod -R u+x nvidia/cu13/bin nvidia/cu13/compute-sanitizer 2>/dev/null)
CS=$S/nvidia/cu13/bin/compute-sanitizer; export PATH=$S/nvidia/cu13/bin:$PATH; echo "sanitizer: $CS" >> $L
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 $CS --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py --self-checked-only > $OUT/memcheck.log 2>&1; step memcheck $?
tail -8 $OUT/memcheck.log >> $L
