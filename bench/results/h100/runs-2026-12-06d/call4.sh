#!/usr/bin/env bash
# the metadata ops' validated cost at d9f30d5 beside 26d528a (mixed_indices and indices_to_csr now test their index
# values), then the GPU tests of tests/dispatch and tests/backends and memcheck of the self-checked ops
L=$OUT/call4.log
R=$(pwd -P)
cd .ab/new3 || exit 1
export SWA_COMMIT=d9f30d5; . bench/gpu_env.sh >> $L 2>&1
mkdir -p /tmp/oldpp && ln -sfn "$R/.ab/old" /tmp/oldpp/swa_backends
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 90 python3 bench/bench_validation.py --skip-grid --out /tmp/bvn > $OUT/bv_new.log 2>&1; step new $?; cp /tmp/bvn/bench_validation.json $OUT/bv_new.json
(cd ../old && PYTHONPATH=/tmp/oldpp:$PYTHONPATH timeout 90 python3 bench/bench_validation.py --skip-grid --out /tmp/bvo > $OUT/bv_old.log 2>&1); step old $?; cp /tmp/bvo/bench_validation.json $OUT/bv_old.json
timeout 330 python3 -m pytest -q -m gpu tests/dispatch/test_self_checked.py tests/dispatch/test_index_values_below_pad.py > /tmp/t1.log 2>&1 &
timeout 330 python3 -m pytest -q -m gpu tests/dispatch tests/backends --ignore=tests/dispatch/test_self_checked.py --ignore=tests/dispatch/test_index_values_below_pad.py > /tmp/t2.log 2>&1 &
wait; step tests 0; tail -15 /tmp/t1.log >> $L; tail -15 /tmp/t2.log >> $L
S=$(mktemp -d); (cd $S && python3 -m zipfile -e $R/.sanitizer/*.whl . && chmod -R u+x nvidia/cu13/bin nvidia/cu13/compute-sanitizer)
PATH=$S/nvidia/cu13/bin:$PATH PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py --self-checked-only > $OUT/sanitizer_self_checked.txt 2>&1; step memcheck $?
tail -3 $OUT/sanitizer_self_checked.txt >> $L
