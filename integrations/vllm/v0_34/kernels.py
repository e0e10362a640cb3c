"""Where vLLM 0.34's replay-metadata kernels live and how its call sites launch them: as in 0.33,
so this module *is* 0.33's (``v0_33/kernels.py``): the four kernels' fingerprints and their
call sites are unchanged (``v0_34/seams.py``). Importing this name gives that module.
"""

import sys

from ..v0_33 import kernels as _same

sys.modules[__name__] = _same
