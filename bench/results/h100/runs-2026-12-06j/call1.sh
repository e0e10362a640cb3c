#!/usr/bin/env bash
# issue 38 item 1: forms that run their own quick checks (new) beside 5840446 (old), same machine, alternating
L=$OUT/call1.log
cd .ab/new || exit 1
export SWA_COMMIT=$NEW_COMMIT; . bench/gpu_env.sh >> $L 2>&1
OLDPP=$(mktemp -d)
ln -sfn "$(cd ../old && pwd -P)" $OLDPP/swa_backends
(cd $OLDPP && PYTHONPATH=$OLDPP python3 -c "import swa_backends, os; print('old pack:', os.path.realpath(swa_backends.__file__))") >> $L 2>&1
(cd $(mktemp -d) && python3 -c "import swa_backends, os; print('new pack:', os.path.realpath(swa_backends.__file__))") >> $L 2>&1
t0=$(date +%s)
step() { echo "== $1 rc=$2 $(( $(date +%s)-t0 ))s" >> $L; }
for i in 1 2; do
  timeout 90 python3 bench/bench_validation.py --skip-grid --out /tmp/bvn$i >> $L 2>&1; step new$i $?; cp /tmp/bvn$i/bench_validation.json $OUT/bv_new$i.json
  (cd ../old && PYTHONPATH=$OLDPP:$PYTHONPATH timeout 90 python3 bench/bench_validation.py --skip-grid --out /tmp/bvo$i >> $L 2>&1); step old$i $?; cp /tmp/bvo$i/bench_validation.json $OUT/bv_old$i.json
done
timeout 120 python3 bench/experiments/exp_self_checked.py --out $OUT >> $L 2>&1; step self_checked $?
