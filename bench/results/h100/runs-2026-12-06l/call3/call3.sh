#!/usr/bin/env bash
t0=$(date +%s)
. bench/gpu_env.sh > $OUT/env.log 2>&1
ROOT=$PWD
OLDPP=$(mktemp -d); ln -sfn $ROOT/.ab/old $OLDPP/swa_backends
mkdir -p $OUT/r
run() {  # run TREE TAG
  if [ "$1" = new ]; then
    (cd $ROOT && python3 bench/bench_validation.py --skip-grid --rounds 401 --out $OUT/r/v_$2 > $OUT/r/v_$2.log 2>&1)
  else
    (cd $ROOT/.ab/old && PYTHONPATH=$OLDPP:$PYTHONPATH python3 bench/bench_validation.py --skip-grid --rounds 401 --out $OUT/r/v_$2 > $OUT/r/v_$2.log 2>&1)
  fi
  echo "$2 rc=$? $(( $(date +%s)-t0 ))s"
}
for i in 1 2 3 4 5; do
  for t in new old; do
    [ $(( $(date +%s)-t0 )) -gt 380 ] && break 2
    run $t ${t}$i
  done
done
python3 bench/experiments/exp_self_checked.py --out $OUT/r/sc_new > $OUT/r/sc_new.log 2>&1; echo "sc_new rc=$? $(( $(date +%s)-t0 ))s"
(cd $ROOT/.ab/old && PYTHONPATH=$OLDPP:$PYTHONPATH python3 bench/experiments/exp_self_checked.py --out $OUT/r/sc_old > $OUT/r/sc_old.log 2>&1); echo "sc_old rc=$? $(( $(date +%s)-t0 ))s"
python3 .ab/prof.py c > $OUT/r/prof_c.log 2>&1; tail -3 $OUT/r/prof_c.log
python3 - <<'PY'
import json, glob, os
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/r/v_*/bench_validation.json")):
    d = json.load(open(f))
    ops = {r["op"]: r for r in d.get("ops", [])}
    top = sorted(((r["host_ratio"], o) for o, r in ops.items()), reverse=True)[:3]
    p = ops["pad_replayed_slots"]
    print(f.split('/')[-2], "pad %.2f (%.1f/%.1f)" % (p["host_ratio"], p["host_on_us"], p["host_off_us"]),
          " top:", ", ".join("%s %.2f" % (o[:12], r) for r, o in top))
PY
cd $OUT && tar czf r.tgz r && rm -rf r
