# as run: export SWA_COMMIT=4e8a9b5; bash .ab/cl8.sh  (.ab/smem_probe.py is the copy beside this file)
. bench/gpu_env.sh > /dev/null 2>&1; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
cp machine.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 .ab/smem_probe.py $OUT/smem_probe.json > $OUT/smem_probe.log 2>&1; echo "rc=$?"; grep "^H \|rror" $OUT/smem_probe.log | cut -c1-250
