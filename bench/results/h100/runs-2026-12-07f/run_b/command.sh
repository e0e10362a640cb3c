. bench/gpu_env.sh > /dev/null 2>&1
root=$(pwd -P); t0=$(date +%s); cp machine.txt $OUT/ 2>/dev/null
pn=$(mktemp -d); ln -s $root $pn/swa_backends; pb=$(mktemp -d); ln -s $root/.ab/base $pb/swa_backends
for pp in $pn $pb; do (cd /tmp && PYTHONPATH=$pp python3 -c "import os, swa_backends as s; print(os.path.realpath(s.__file__))"); done
for i in 1 2 3; do
  for tree in new base; do
    if [ $tree = new ]; then pp=$pn; dir=$root; else pp=$pb; dir=$root/.ab/base; fi
    (cd $dir && PYTHONPATH=$pp timeout 120 python3 bench/bench_validation.py --skip-grid --rounds 401 --out $OUT/$tree$i > $OUT/$tree$i.log 2>&1); echo "$tree$i rc=$? $(( $(date +%s)-t0 ))s $(grep -m1 'compressed_slot_mapping' $OUT/$tree$i.log)"
  done
done
python3 - <<'PY'
import json, os, statistics as st
out = os.environ["OUT"]
for tree in ("new", "base"):
    rows = []
    for i in (1, 2, 3):
        d = json.load(open(f"{out}/{tree}{i}/bench_validation.json"))
        r = next(r for r in d["ops"] if r["op"] == "compressed_slot_mapping")
        rows.append((r["host_on_us"], r["host_off_us"], r["host_bare_us"], r["wall_on_us"], d["meta"].get("commit"), d["meta"].get("swa_backends", "")))
    print(tree, [tuple(round(x, 1) if isinstance(x, float) else x for x in r[:4]) for r in rows], "median on/off/bare",
          [round(st.median(r[k] for r in rows), 1) for k in range(4)])
PY
