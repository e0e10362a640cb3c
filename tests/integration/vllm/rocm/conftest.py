"""vLLM's ROCm DeepSeek-V4.1 path on a faked AMD GPU (needs vLLM; run by ``../test_vllm_rocm.py``).

``vllm.platforms.rocm`` reads the GPU's arch once, at import (amdsmi, else
``torch.cuda.get_device_properties("cuda").gcnArchName``), and ``vllm.models.deepseek_v41.amd``
imports it, so on a machine without an AMD GPU none of vLLM's ROCm modules import. With
``SWA_TEST_FAKE_GCN=gfx942`` (or ``gfx950``) this conftest answers that query with the arch
before anything imports vLLM; each arch runs in its own process (the arch is a module
constant). Without the variable the folder is not collected: the outer test starts one
pytest process per arch.
"""

from __future__ import annotations

import os
import sys

import torch

ARCH = os.environ.get("SWA_TEST_FAKE_GCN")

if ARCH:
    class _Props:
        gcnArchName = f"{ARCH}:sramecc+:xnack-"
        name = f"faked {ARCH}"

    torch.cuda.get_device_properties = lambda *args, **kwargs: _Props()
else:
    collect_ignore_glob = ["test_*.py"]

# the harness modules of the folder above (_cases, _configs, _vllm_harness)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
