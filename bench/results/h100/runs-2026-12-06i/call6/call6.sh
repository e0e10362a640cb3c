#!/usr/bin/env bash
# the huge-stride memcheck slices as test_sanitize_gpu now cuts them on an H100 (the first two), then racecheck
L=$OUT/call6.log
R=$(pwd -P)
cd .ab/new10 || exit 1
export SWA_COMMIT=013428e; . bench/gpu_env.sh >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
S=$(mktemp -d); (cd $S && python3 -m zipfile -e $R/.sanitizer/*.whl . && chmod -R u+x nvidia/cu13/bin nvidia/cu13/compute-sanitizer)
export PATH=$S/nvidia/cu13/bin:$PATH
python3 -c "import sys; sys.path.insert(0, 'tests/kernels'); import torch, test_sanitize_gpu as t; print('per process', t.huge_per_process(torch.cuda.get_device_properties(0).total_memory))" >> $L 2>&1
for sl in 0:3 3:6; do PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py --huge-only $sl > $OUT/huge_${sl/:/_}.txt 2>&1; step huge_$sl $?; tail -2 $OUT/huge_${sl/:/_}.txt >> $L; done
timeout $((560-$(date +%s)+t0)) python3 -m pytest -q -m gpu tests/kernels/test_sanitize_gpu.py -k racecheck > $OUT/racecheck.log 2>&1; step racecheck $?; tail -3 $OUT/racecheck.log >> $L
