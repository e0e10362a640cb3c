# as run: export SWA_COMMIT=952303d; bash .ab/cl7.sh  (.ab/ws_smwg_pf.py: ws_smwg_pf.diff of runs-2026-12-07/ (4126dfc) applied to the kernel; .ab/ws_smwg_pf_nogather.py: that file with the change in smwg_pf_nogather.diff)
. bench/gpu_env.sh > /dev/null 2>&1; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
t0=$(date +%s)
cp machine.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 bench/experiments/check_ws_copies.py --out $OUT bench/experiments/cluster/sparse_mla_cluster.py > $OUT/check_ws_copies.log 2>&1; echo "check rc=$? $(( $(date +%s)-t0 ))s"; tail -4 $OUT/check_ws_copies.log
timeout 240 python3 bench/experiments/exp_ws_floor.py --out $OUT --reps 5 --extra smwg_pf=.ab/ws_smwg_pf.py --extra smwg_pf_nogather=.ab/ws_smwg_pf_nogather.py > $OUT/exp_ws_floor.log 2>&1; echo "floor rc=$? $(( $(date +%s)-t0 ))s"; tail -30 $OUT/exp_ws_floor.log | cut -c1-250
