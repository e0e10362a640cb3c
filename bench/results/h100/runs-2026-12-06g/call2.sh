#!/usr/bin/env bash
# mixed_indices' checked form under two caps on its checker programs, beside torch's own check of the same values
L=$OUT/call2.log
cd .ab/new7 || exit 1
export SWA_COMMIT=482cfcf; . bench/gpu_env.sh >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 240 python3 bench/experiments/exp_checker_wait.py --out $OUT --ops mixed_indices --naps 2048 --max-checkers 1024,2048,4096 > $OUT/cw.log 2>&1; step checker_wait $?
timeout 200 python3 -m pytest -q -m gpu tests/dispatch/test_self_checked.py -k "mixed or large_grids" > /tmp/t1.log 2>&1; step tests $?; tail -8 /tmp/t1.log >> $L
timeout 120 python3 bench/bench_validation.py --skip-grid --out /tmp/bv > $OUT/bv.log 2>&1; step bench_validation $?; cp /tmp/bv/bench_validation.json $OUT/bench_validation.json
