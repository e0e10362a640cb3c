#!/usr/bin/env bash
# issue 38 item 1: 2888291 beside 5840446, 401 rounds a run, three alternations; exp_self_checked of both
L=$OUT/call6.log
cd .ab/new || exit 1
export SWA_COMMIT=$NEW_COMMIT; . bench/gpu_env.sh >> $L 2>&1
OLDPP=$(mktemp -d)
ln -sfn "$(cd ../old && pwd -P)" $OLDPP/swa_backends
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
for i in 1 2 3; do
  timeout 90 python3 bench/bench_validation.py --skip-grid --rounds 401 --out /tmp/bvn$i >> $L 2>&1; step new$i $?; cp /tmp/bvn$i/bench_validation.json $OUT/bv_new$i.json
  (cd ../old && PYTHONPATH=$OLDPP:$PYTHONPATH timeout 90 python3 bench/bench_validation.py --skip-grid --rounds 401 --out /tmp/bvo$i >> $L 2>&1); step old$i $?; cp /tmp/bvo$i/bench_validation.json $OUT/bv_old$i.json
done
timeout 100 python3 bench/experiments/exp_self_checked.py --out $OUT >> $L 2>&1; step self_checked_new $?
