#!/usr/bin/env bash
# Source on the GPU machine (repo root): makes the checkout importable as swa_backends
# without installing it, and records the machine (GPU, driver, torch, triton) under $OUT.
mkdir -p /tmp/swa_pp && ln -sfn "$PWD" /tmp/swa_pp/swa_backends
export PYTHONPATH=/tmp/swa_pp${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: ${SWA_COMMIT:-unknown (set SWA_COMMIT)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  python3 -c 'import torch, triton, sys; print(f"python: {sys.version.split()[0]}\ntorch: {torch.__version__} (cuda {torch.version.cuda})\ntriton: {triton.__version__}")'
} | tee "${OUT:-.}/machine.txt"
