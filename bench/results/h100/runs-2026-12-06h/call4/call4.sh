#!/usr/bin/env bash
# the metadata ops' validated cost with the switch set before the timing, beside a checked=False backend; where it goes
L=$OUT/call4.log
cd .ab/new8 || exit 1
export SWA_COMMIT=b119ec7; . bench/gpu_env.sh >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 100 python3 bench/bench_validation.py --skip-grid --out /tmp/bv > $OUT/bv.log 2>&1; step bench_validation $?; cp /tmp/bv/bench_validation.json $OUT/bench_validation.json
timeout 200 python3 bench/experiments/exp_self_checked.py --out $OUT > $OUT/exp_self_checked.log 2>&1; step self_checked $?
