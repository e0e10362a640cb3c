#!/usr/bin/env bash
t0=$(date +%s)
. bench/gpu_env.sh > $OUT/env.log 2>&1
mkdir -p $OUT/r
python3 -m pytest -q -m gpu tests/dispatch 2>&1 | tail -15 > $OUT/r/gpu_dispatch.log; echo "dispatch tests $(( $(date +%s)-t0 ))s"; tail -3 $OUT/r/gpu_dispatch.log
python3 -m pytest -q -m gpu tests/kernels/test_triton_gpu.py -k "graph_capture or conformance" 2>&1 | tail -15 > $OUT/r/gpu_triton.log; echo "triton tests $(( $(date +%s)-t0 ))s"; tail -3 $OUT/r/gpu_triton.log
python3 .ab/prof.py d > $OUT/r/prof_d.log 2>&1; tail -16 $OUT/r/prof_d.log
for i in 1 2 3; do
  [ $(( $(date +%s)-t0 )) -gt 480 ] && break
  python3 bench/bench_validation.py --skip-grid --rounds 401 --out $OUT/r/v_head$i > $OUT/r/v_head$i.log 2>&1; echo "v_head$i rc=$? $(( $(date +%s)-t0 ))s"
done
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
