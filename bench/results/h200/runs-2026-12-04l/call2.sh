#!/bin/bash
# GPU call: check the prefetch / early-load / fold copies, time them beside the kernel; exp_ws_floor with the gather-kept mma copies
O=$OUT; mkdir -p /tmp/m; export OUT=/tmp/m SWA_COMMIT=894f76e; . bench/gpu_env.sh >/dev/null; export OUT=$O
cp /tmp/m/machine.txt $OUT/; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
V=""; for n in pf early pf_early fold; do V="$V --variant $n=.ab/ws_$n.py"; done
timeout 200 python3 .ab/check_variants.py .ab/ws_pf.py .ab/ws_early.py .ab/ws_pf_early.py .ab/ws_fold.py > $OUT/check_variants.log 2>&1
echo "check rc $?" >> $OUT/check_variants.log
python3 bench/bench_flashmla.py --out $OUT $V --skip pack_flashmla,pack_default,pack_default_validated > $OUT/bench_flashmla.log 2>&1
echo "bench rc $?"; tail -3 $OUT/check_variants.log; tail -8 $OUT/bench_flashmla.log
python3 bench/experiments/exp_ws_floor.py --out $OUT > $OUT/exp_ws_floor.log 2>&1
echo "floor rc $?"; tail -9 $OUT/exp_ws_floor.log
