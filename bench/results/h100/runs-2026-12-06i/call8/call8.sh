#!/usr/bin/env bash
# after conformance.to_device keeps the cases' layouts: the GPU tests that hand variants run_op's copies
L=$OUT/call8.log
cd .ab/new11 || exit 1
export SWA_COMMIT=8501bac; . bench/gpu_env.sh >> $L 2>&1
export PYTHONPATH=$(cd ../.. && pwd -P)/.flashmla:$PYTHONPATH
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 100 python3 -m pytest -q -m gpu tests/backends/test_platform_gpu.py > $OUT/platform_gpu.log 2>&1; step platform_gpu $?; tail -4 $OUT/platform_gpu.log >> $L
timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_triton_gpu.py -k "conformance_on_gpu" > $OUT/triton_gpu.log 2>&1; step triton_gpu $?; tail -4 $OUT/triton_gpu.log >> $L
