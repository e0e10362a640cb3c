"""DeepSeek-V4.1 in vLLM 0.34: this module *is* 0.33's model module (``v0_33/model.py``).

The model class, the model-state, replay-layer and replay-graph mixins rely on definitions
0.34 kept (the seam table, ``v0_34/seams.py``, pins them with 0.34's values), so 0.34 runs the
same code: importing this name gives that module (one module object, so one set of state and
one place a test patches). The decision it acts on is 0.34's: ``config.decide`` reads the
installed release's rules (``v0_34/config.py``), under which the pack never turns on encoder
replay on ROCm itself (vLLM 0.34 keeps it on for CDNA 3 and 4, with its own prefill attention).
"""

import sys

from ..v0_33 import model as _same

sys.modules[__name__] = _same
