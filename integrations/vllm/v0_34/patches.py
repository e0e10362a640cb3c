"""The patches with vLLM 0.34: this module *is* 0.33's (``v0_33/patches.py``).

The three patched globals of the replay metadata and their call sites have 0.33's calling
conventions and fingerprints in 0.34 (``v0_34/seams.py``). The fourth, ROCm's
``rocm_sparse_attn_prefill``, is applied and stays inert: it is routed only where the pack turns
encoder replay on on ROCm itself, which it never does with 0.34
(``config.PACK_TURNS_ROCM_ENCODER_ON``). Importing this name gives that module.
"""

import sys

from ..v0_33 import patches as _same

sys.modules[__name__] = _same
