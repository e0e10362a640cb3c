#!/usr/bin/env bash
t0=$(date +%s)
. bench/gpu_env.sh > $OUT/env.log 2>&1
export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
grep -v '^#' $OUT/machine.txt 2>/dev/null | head -12
timeout $((230-$(date +%s)+t0)) python3 bench/bench_flashmla.py --out $OUT/fm1 > $OUT/bench_flashmla1.log 2>&1
echo "flashmla1 rc=$? $(( $(date +%s)-t0 ))s"; tail -24 $OUT/bench_flashmla1.log
