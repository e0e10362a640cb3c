. bench/gpu_env.sh > /dev/null 2>&1
root=$(pwd -P); t0=$(date +%s); cp machine.txt $OUT/ 2>/dev/null
pn=$(mktemp -d); ln -s $root $pn/swa_backends; pb=$(mktemp -d); ln -s $root/.ab/base $pb/swa_backends
for pp in $pn $pb; do (cd /tmp && PYTHONPATH=$pp python3 -c "import os, swa_backends as s; print(os.path.realpath(s.__file__))"); done
timeout 150 python3 -m pytest -q -m gpu tests/dispatch/test_self_checked.py -k compressed 2>&1 | tail -3 > $OUT/gpu_self_checked.log; echo "self_checked rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/gpu_self_checked.log
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_triton_gpu.py -k "compressed and not warmup_then_serving" 2>&1 | tail -3 > $OUT/gpu_triton.log; echo "triton rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/gpu_triton.log
S=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
(unset TRITON_INTERPRET; PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 $S --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py --self-checked-only > $OUT/sanitizer_self_checked.txt 2>&1); echo "sanitizer rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/sanitizer_self_checked.txt
mkdir -p /tmp/abv
for i in 1 2 3; do
  for tree in new base; do
    if [ $tree = new ]; then pp=$pn; dir=$root; else pp=$pb; dir=$root/.ab/base; fi
    (cd $dir && PYTHONPATH=$pp timeout 120 python3 bench/bench_validation.py --skip-grid --rounds 401 --out /tmp/abv/$tree$i > /tmp/abv/$tree$i.log 2>&1); echo "$tree$i rc=$? $(( $(date +%s)-t0 ))s $(grep -m1 'compressed_slot_mapping' /tmp/abv/$tree$i.log)"
  done
done
python3 - <<'PY'
import json, os, statistics as st
out = os.environ["OUT"]
runs = {f"{t}{i}": json.load(open(f"/tmp/abv/{t}{i}/bench_validation.json")) for t in ("new", "base") for i in (1, 2, 3)}
json.dump(runs, open(f"{out}/ab_bench_validation_ops.json", "w"), indent=1)
for tree in ("new", "base"):
    rows = [next(r for r in runs[f"{tree}{i}"]["ops"] if r["op"] == "compressed_slot_mapping") for i in (1, 2, 3)]
    keys = ("host_on_us", "host_off_us", "host_bare_us", "wall_on_us", "host_ratio")
    print(tree, "median", {k: round(st.median(r[k] for r in rows), 2) for k in keys}, "runs", [round(r["host_on_us"], 1) for r in rows])
PY
cat /tmp/abv/new2.log > $OUT/bench_validation_ops_new2.log
