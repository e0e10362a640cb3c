. bench/gpu_env.sh > /dev/null 2>&1; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
t0=$(date +%s)
cp machine.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 .ab/cl_quick.py > $OUT/quick.log 2>&1; echo "quick rc=$? $(( $(date +%s)-t0 ))s"; tail -c 4000 $OUT/quick.log
PV=$(cat $OUT/pv.txt)
if [ -n "$PV" ]; then
  export SWA_CLUSTER_PV=$PV
  V="--variant cluster=bench/experiments/cluster/sparse_mla_cluster.py --variant cluster_pf=bench/experiments/cluster/sparse_mla_cluster_pf.py"
  timeout 260 python3 bench/bench_flashmla.py --out $OUT $V --skip pack_flashmla,pack_default,pack_default_validated > $OUT/bench_flashmla.log 2>&1; echo "bench rc=$? $(( $(date +%s)-t0 ))s"; tail -32 $OUT/bench_flashmla.log
  timeout 90 python3 .ab/cl_abl.py $OUT/cl_abl.json > $OUT/cl_abl.log 2>&1; echo "abl rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/cl_abl.log | tail -8
  timeout $((585-$(date +%s)+t0)) python3 bench/experiments/check_ws_copies.py --out $OUT bench/experiments/cluster/sparse_mla_cluster.py > $OUT/check.log 2>&1; echo "check rc=$? $(( $(date +%s)-t0 ))s"; tail -15 $OUT/check.log
fi
