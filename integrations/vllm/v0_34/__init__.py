"""Everything the vLLM integration ties to vLLM 0.34 (``RELEASES["0.34"]``).

Each module is this release's part of the core module of the same name (the checklist for a
new release: ``swa_backends.integrations.vllm``'s docstring). What 0.34 changed of the code
the integration relies on, and so what is this release's own:

* :mod:`.seams`: the seam table, every value taken from 0.34.0 (``python -m
  swa_backends.integrations.vllm.v0_34.seams``). 0.34 has model runner V2 only, so the
  runner seams of 0.33 are gone;
* :mod:`.config`: the rules that moved (model runner V2 only; sequence-parallel MoE without
  the PP-1 condition; encoder replay on on ROCm for CDNA 3 and 4, with vLLM's own prefill
  attention) and the lines they follow;
* :mod:`.target`: the decision command's model-runner rule (V2 only).

The model class and mixins, the patches and the kernels' launch conventions are 0.33's
modules (importing :mod:`.model`, :mod:`.patches` or :mod:`.kernels` gives 0.33's module
object): every definition
they override, reproduce, call or patch has the same parameters and, where they reproduce or
patch it, the same fingerprint in 0.34 (the seam table pins each with 0.34's values). What 0.34
added around them (the replay batch's MoE padding mask, a capture stream for the replay
graphs, decode graphs keyed by query length) is vLLM's own code on either side of the pack's.
Each part is imported on first access (``release.model``); none imports vLLM at import.
"""

from __future__ import annotations

import importlib

from .. import RELEASE_PARTS

#: the release every pinned parameter list, fingerprint, file hash and mirrored line here was taken from
RELEASE = "0.34.0"


def __getattr__(name: str):
    if name in RELEASE_PARTS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
