#!/usr/bin/env bash
# Source on the GPU machine, from the repository root:  . bench/gpu_env.sh
#
# 1. Makes this checkout the `swa_backends` that python3 imports: `python3 -m pip install -e .
#    --no-deps --no-build-isolation` (the machine has torch and Triton, no network); if that fails
#    (an externally managed system Python, an old setuptools, ...) or the import then resolves to
#    another copy, falls back to a temporary folder holding a symlink `swa_backends` -> this
#    checkout, put first on PYTHONPATH.
# 2. Records the machine (date, commit, GPU, driver, Python, torch, Triton, how the pack was
#    imported) in $OUT/machine.txt (./machine.txt without $OUT).
# Set SWA_COMMIT=<commit> first: the copy on the GPU machine has no git history.
# Sourced, so it never exits the caller's shell.

_swa_root=$(pwd -P)
export PYTHONUNBUFFERED=1
# `python3 -c` puts its working directory first on sys.path: the check below runs in an empty
# folder of its own (mktemp -d: this user's, mode 0700), never in /tmp, where anyone can leave a
# swa_backends/ that would be imported (and run) in place of the pack. (Without one: the checkout,
# which holds no swa_backends/ of its own.)
_swa_empty=$(mktemp -d 2>/dev/null || true)
_swa_where() {  # the folder python3 imports swa_backends from ("" when it does not)
  (cd "${_swa_empty:-$_swa_root}" && python3 -c 'import os, swa_backends; print(os.path.dirname(os.path.realpath(swa_backends.__file__)))' 2>/dev/null)
}
_swa_how=""
if _swa_log=$(python3 -m pip install -q -e . --no-deps --no-build-isolation 2>&1); then
  if [ "$(_swa_where)" = "$_swa_root" ]; then
    _swa_how="pip install -e . (editable)"
  else
    _swa_how="pip install -e . succeeded but swa_backends resolves to '$(_swa_where)'"
  fi
else
  _swa_why=$(printf '%s\n' "$_swa_log" | grep -i -m1 'error' || printf '%s\n' "$_swa_log" | tail -1)
  _swa_how="pip install -e . failed: $(printf '%s' "$_swa_why" | sed 's/^ *//' | cut -c1-200)"
fi
if [ "$(_swa_where)" != "$_swa_root" ]; then
  _swa_pp=$(mktemp -d /tmp/swa_pp.XXXXXX)
  ln -sfn "$_swa_root" "$_swa_pp/swa_backends"
  export PYTHONPATH="$_swa_pp${PYTHONPATH:+:$PYTHONPATH}"
  _swa_how="$_swa_how; using PYTHONPATH=$_swa_pp (symlink swa_backends -> $_swa_root)"
fi
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: ${SWA_COMMIT:-$(git -C "$_swa_root" rev-parse --short HEAD 2>/dev/null || echo 'unknown (set SWA_COMMIT)')}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  python3 -c 'import torch, triton, sys; print(f"python: {sys.version.split()[0]}\ntorch: {torch.__version__} (cuda {torch.version.cuda})\ntriton: {triton.__version__}")'
  echo "pack: $_swa_how"
  echo "swa_backends: $(_swa_where)"
} | tee "${OUT:-.}/machine.txt"
unset -f _swa_where
[ -z "$_swa_empty" ] || rmdir "$_swa_empty"
unset _swa_log _swa_why _swa_pp _swa_how _swa_empty
