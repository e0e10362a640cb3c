. bench/gpu_env.sh > /dev/null 2>&1; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
t0=$(date +%s)
cp machine.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 .ab/cl_quick.py > $OUT/quick.log 2>&1; echo "quick rc=$? $(( $(date +%s)-t0 ))s"; grep "^H \|good\|PV\|rror" $OUT/quick.log | cut -c1-250
if [ -n "$(cat $OUT/pv.txt)" ]; then
  timeout 90 python3 .ab/cl_abl.py $OUT/cl_abl.json > $OUT/cl_abl.log 2>&1; echo "abl rc=$? $(( $(date +%s)-t0 ))s"; grep "^H " $OUT/cl_abl.log
  V="--variant cluster=bench/experiments/cluster/sparse_mla_cluster.py --variant cluster_pf=bench/experiments/cluster/sparse_mla_cluster_pf.py"
  timeout 150 python3 bench/bench_flashmla.py --out $OUT $V --skip pack_flashmla,pack_default,pack_default_validated > $OUT/bench_flashmla.log 2>&1; echo "bench rc=$? $(( $(date +%s)-t0 ))s"; grep "^ws_cluster\|gluon_ws / direct\|^| " $OUT/bench_flashmla.log | tail -20
  timeout $((585-$(date +%s)+t0)) python3 bench/experiments/check_ws_copies.py --out $OUT bench/experiments/cluster/sparse_mla_cluster.py > $OUT/check.log 2>&1; echo "check rc=$? $(( $(date +%s)-t0 ))s"; tail -4 $OUT/check.log
fi
