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
modules (:data:`SHARED_PARTS`: ``release.model`` is ``v0_33.model``, and vLLM's registry is
given that module's class): every definition they override, reproduce, call or patch has the
same parameters and, where they reproduce or patch it, the same fingerprint in 0.34 (the seam
table pins each with 0.34's values). Under 0.34 they act on 0.34's decision: the core's
``config.decide`` reads the installed release's rules, under which the pack never turns encoder
replay on on ROCm itself (``config.PACK_TURNS_ROCM_ENCODER_ON``), so 0.33's ROCm prefill
patch is applied and stays inert. What 0.34 added around them (the replay batch's MoE padding
mask, a capture stream for the replay graphs, decode graphs keyed by query length) is vLLM's
own code on either side of the pack's. Each part is imported on first access
(``release.model``); none imports vLLM at import.
"""

from __future__ import annotations

from .. import release_part

#: the release every pinned parameter list, fingerprint, file hash and mirrored line here was taken from
RELEASE = "0.34.0"

#: part -> the earlier release whose module it is, unchanged
SHARED_PARTS: dict[str, str] = {"model": "v0_33", "patches": "v0_33", "kernels": "v0_33"}


def __getattr__(name: str):
    return release_part(__name__, name, SHARED_PARTS)
