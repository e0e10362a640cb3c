#!/usr/bin/env bash
# issue 38 item 1: plain_indices' grouped checkers (5e85a5f) beside 26d528a, same machine, alternating
L=$OUT/call1.log
cd .ab/new || exit 1
export SWA_COMMIT=5e85a5f; . bench/gpu_env.sh >> $L 2>&1
mkdir -p /tmp/oldpp && ln -sfn "$(cd ../old && pwd -P)" /tmp/oldpp/swa_backends
(cd /tmp && PYTHONPATH=/tmp/oldpp:$PYTHONPATH python3 -c "import swa_backends, os; print(\"old pack:\", os.path.realpath(swa_backends.__file__))") >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
timeout 200 python3 bench/experiments/exp_plain_indices_parts.py --out $OUT --copies base,checkers_only --before ../plain_indices_before.py --reps 150 >> $L 2>&1; step parts $?
for i in 1 2; do
  timeout 90 python3 bench/bench_validation.py --skip-grid --out /tmp/bvn$i >> $L 2>&1; step new$i $?; cp /tmp/bvn$i/bench_validation.json $OUT/bv_new$i.json
  (cd ../old && PYTHONPATH=/tmp/oldpp:$PYTHONPATH timeout 90 python3 bench/bench_validation.py --skip-grid --out /tmp/bvo$i >> $L 2>&1); step old$i $?; cp /tmp/bvo$i/bench_validation.json $OUT/bv_old$i.json
done
timeout 120 python3 bench/experiments/exp_self_checked.py --out $OUT >> $L 2>&1; step self_checked $?
