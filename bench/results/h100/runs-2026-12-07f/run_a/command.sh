. bench/gpu_env.sh > /dev/null 2>&1
t0=$(date +%s); cp machine.txt $OUT/ 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -m gpu tests/dispatch/test_self_checked.py -k compressed 2>&1 | tail -6 > $OUT/gpu_self_checked.log; echo "self_checked rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/gpu_self_checked.log
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_triton_gpu.py -k "compressed and not warmup_then_serving" 2>&1 | tail -6 > $OUT/gpu_triton.log; echo "triton rc=$? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/gpu_triton.log
S=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
(unset TRITON_INTERPRET; PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 $S --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py --self-checked-only > $OUT/sanitizer_self_checked.txt 2>&1); echo "sanitizer rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/sanitizer_self_checked.txt
timeout 150 python3 bench/bench_validation.py --skip-grid --out $OUT > $OUT/bench_validation_ops.log 2>&1; echo "bench rc=$? $(( $(date +%s)-t0 ))s"; mv $OUT/bench_validation.json $OUT/bench_validation_ops.json; grep -i "compressed\|ratio" $OUT/bench_validation_ops.log | head -8
