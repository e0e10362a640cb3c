#!/usr/bin/env bash
# new tree = this checkout (installed by gpu_env.sh); old tree = .ab/old through a symlink on PYTHONPATH
t0=$(date +%s)
. bench/gpu_env.sh > $OUT/env.log 2>&1
ROOT=$PWD
OLDPP=$(mktemp -d); ln -sfn $ROOT/.ab/old $OLDPP/swa_backends
run() {  # run TREE TAG
  if [ "$1" = new ]; then
    (cd $ROOT && python3 bench/bench_validation.py --skip-grid --rounds 401 --out $OUT/v_$2 > $OUT/v_$2.log 2>&1)
  else
    (cd $ROOT/.ab/old && PYTHONPATH=$OLDPP:$PYTHONPATH python3 bench/bench_validation.py --skip-grid --rounds 401 --out $OUT/v_$2 > $OUT/v_$2.log 2>&1)
  fi
  echo "$2 rc=$? $(( $(date +%s)-t0 ))s"
}
python3 -c "import swa_backends, torch; print(swa_backends.__file__, torch.__version__)"
(cd /tmp && PYTHONPATH=$OLDPP:$PYTHONPATH python3 -c "import swa_backends; print(swa_backends.__file__)")
for i in 1 2 3; do
  for t in new old; do
    [ $(( $(date +%s)-t0 )) -gt 430 ] && break 2
    run $t ${t}$i
  done
done
python3 bench/experiments/exp_self_checked.py --out $OUT/sc_new > $OUT/sc_new.log 2>&1; echo "sc_new rc=$? $(( $(date +%s)-t0 ))s"
python3 - <<'PY'
import json, glob, os
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/v_*/bench_validation.json")):
    d = json.load(open(f))
    ops = {r["op"]: r for r in d.get("ops", [])}
    row = []
    print(f.split('/')[-2], "max", max(((r["host_ratio"], o) for o, r in ops.items()), default=None))
    for op in ("pad_replayed_slots", "compressed_slot_mapping", "mixed_indices", "plain_indices", "swa_indices_and_lens"):
        r = ops.get(op, {})
        row.append(f"{op[:8]} {r.get('host_ratio', 0):.2f} ({r.get('host_on_us', 0):.1f}/{r.get('host_off_us', 0):.1f})")
    print(f.split('/')[-2], row)
PY
