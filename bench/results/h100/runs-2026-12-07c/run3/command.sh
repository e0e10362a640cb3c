# as run: export SWA_COMMIT=952303d; D=300 bash .ab/cl5.sh  (.ab/ held cl_quick.py and cl_abl.py, the copies beside this folder)
. bench/gpu_env.sh > /dev/null 2>&1; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
t0=$(date +%s); D=${D:-200}
cp machine.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
python3 .ab/cl_quick.py > $OUT/quick.log 2>&1; echo "quick rc=$? $(( $(date +%s)-t0 ))s"; grep "^H \|good\|PV\|rror\|TIMEOUT" $OUT/quick.log | cut -c1-160
if [ -n "$(cat $OUT/pv.txt)" ]; then
  timeout 70 python3 .ab/cl_abl.py $OUT/cl_abl.json > $OUT/cl_abl.log 2>&1; echo "abl rc=$? $(( $(date +%s)-t0 ))s"; grep "^H \|flashmla:" $OUT/cl_abl.log
  timeout $((D-$(date +%s)+t0)) python3 bench/bench_flashmla.py --out $OUT --variant cluster=bench/experiments/cluster/sparse_mla_cluster.py --skip pack_flashmla,pack_default,pack_default_validated > $OUT/bench_flashmla.log 2>&1; echo "bench rc=$? $(( $(date +%s)-t0 ))s"; grep "^ws_cluster\|^H " $OUT/bench_flashmla.log | tail -18
fi
