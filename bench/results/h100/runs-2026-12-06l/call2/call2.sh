#!/usr/bin/env bash
t0=$(date +%s)
. bench/gpu_env.sh > $OUT/env.log 2>&1
mkdir -p $OUT/r
python3 .ab/prof.py a > $OUT/r/prof_a.log 2>&1; echo "prof rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/r/prof_a.log
python3 -m pytest -q -m gpu tests/dispatch 2>&1 | tail -15 > $OUT/r/gpu_dispatch.log; echo "dispatch tests $(( $(date +%s)-t0 ))s"; tail -4 $OUT/r/gpu_dispatch.log
python3 -m pytest -q -m gpu tests/kernels/test_triton_gpu.py -k "graph_capture or conformance" 2>&1 | tail -15 > $OUT/r/gpu_triton.log; echo "triton tests $(( $(date +%s)-t0 ))s"; tail -4 $OUT/r/gpu_triton.log
python3 .ab/prof.py b > $OUT/r/prof_b.log 2>&1; cat $OUT/r/prof_b.log | tail -3
cd $OUT && tar czf r.tgz r && rm -rf r
