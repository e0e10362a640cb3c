#!/bin/bash
# GPU call: check the lazy-rescale copies on moving-max inputs, then time them beside the kernel
O=$OUT; mkdir -p /tmp/m; export OUT=/tmp/m SWA_COMMIT=894f76e; . bench/gpu_env.sh >/dev/null; export OUT=$O
cp /tmp/m/machine.txt $OUT/; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
V=""; for n in lazy lazy_fold lazy_spec lazy_spec_fold; do V="$V --variant $n=.ab/ws_$n.py"; done
timeout 200 python3 .ab/check_variants.py .ab/ws_lazy.py .ab/ws_lazy_fold.py .ab/ws_lazy_spec.py .ab/ws_lazy_spec_fold.py > $OUT/check_variants.log 2>&1
echo "check rc $?" >> $OUT/check_variants.log
python3 bench/bench_flashmla.py --out $OUT $V --skip pack_flashmla,pack_default,pack_default_validated > $OUT/bench_flashmla.log 2>&1
echo "bench rc $?"; tail -3 $OUT/check_variants.log; tail -8 $OUT/bench_flashmla.log
