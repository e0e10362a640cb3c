#!/usr/bin/env bash
# where a validated call's host time goes, per self-checked op (on whichever host comes)
L=$OUT/call3.log
cd .ab/new7 || exit 1
export SWA_COMMIT=482cfcf; . bench/gpu_env.sh >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 200 python3 bench/experiments/exp_self_checked.py --out $OUT > $OUT/exp_self_checked.log 2>&1; step self_checked $?
timeout 100 python3 bench/bench_validation.py --skip-grid --out /tmp/bv > $OUT/bv.log 2>&1; step bench_validation $?; cp /tmp/bv/bench_validation.json $OUT/bench_validation.json
