#!/usr/bin/env bash
# mixed_indices' workers waiting before they load, beside the op as it is (per size); the metadata ops' validated
# cost on this host; the GPU tests of the mixed_indices checked path
L=$OUT/call1.log
cd .ab/new6 || exit 1
export SWA_COMMIT=e712c76+wait_first; . bench/gpu_env.sh >> $L 2>&1
cp $OUT/machine.txt /dev/null 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 200 python3 bench/experiments/exp_checker_wait.py --out $OUT --ops mixed_indices,mixed_indices_wait_first --naps 2048 > $OUT/cw.log 2>&1; step checker_wait $?
timeout 120 python3 bench/bench_validation.py --skip-grid --out /tmp/bv > $OUT/bv.log 2>&1; step bench_validation $?; cp /tmp/bv/bench_validation.json $OUT/bench_validation.json
timeout 200 python3 -m pytest -q -m gpu tests/dispatch/test_self_checked.py -k "mixed or large_grids" > /tmp/t1.log 2>&1; step tests $?; tail -8 /tmp/t1.log >> $L
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv >> $L
