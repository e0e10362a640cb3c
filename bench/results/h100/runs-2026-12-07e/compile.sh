# compile the copies named (default: every copy of .ab/qreg) offline for sm_90a with this machine's Triton, in
# parallel (the aot script's --report); one log per copy, then all of them
root=$(pwd -P); logs=$(mktemp -d)
names=${*:-$(cd .ab/qreg && ls ws_*.py mma_gather_*.py | sed 's/\.py$//')}
for n in $names; do
  (t=$(mktemp -d); mkdir $t/swa_backends
   (cd $root && (git ls-files 2>/dev/null | grep . || find . -path ./.ab -prune -o -path ./.flashmla -prune -o -path ./.git -prune -o -type f -print | sed 's|^\./||')) | grep -v '^bench/results' | tar cf - -T - 2>/dev/null | tar xf - -C $t/swa_backends
   cp .ab/qreg/$n.py $t/swa_backends/kernels/sparse_mla_gluon_ws.py
   sed -i 's/\[:60\] for ln in v.splitlines() if "Performance Loss"/[:160] for ln in v.splitlines() if "Performance Loss"/' $t/swa_backends/tests/kernels/aot_compile_sparse_mla_gluon.py
   (cd $t/swa_backends && PYTHONPATH=$t timeout 300 python3 tests/kernels/aot_compile_sparse_mla_gluon.py --report 2>&1 | grep -E "gluon_ws\]|gluon_ws wide\]|FAILED|rror" | sed 's/ kv_buffers.*wgmma_waits/ wgmma_waits/' | cut -c1-330) > $logs/$n.log
   rm -rf $t) &
done
wait
for n in $names; do echo "== $n"; cat $logs/$n.log; done
