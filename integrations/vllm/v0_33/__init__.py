"""Everything the vLLM integration ties to vLLM 0.33 (``RELEASES["0.33"]``).

Each module is this release's part of the core module of the same name
(``swa_backends.integrations.vllm``'s docstring lists them and the checklist for a new
release): :mod:`.seams` the seam table, :mod:`.patches` the patched globals and their shims,
:mod:`.model` the model class and the mixins over 0.33's model state and replay layers,
:mod:`.config` the facts the config mapping reads, :mod:`.target` the rules the decision
command re-derives, :mod:`.kernels` where 0.33's replay-metadata kernels live and how its call
sites launch them. Each is imported on first access (``release.model``); none imports vLLM
at import.
"""

from __future__ import annotations

from .. import release_part

#: the release every pinned parameter list, fingerprint, file hash and mirrored line here was taken from
RELEASE = "0.33.0"

#: the parts that are an earlier release's module (none: 0.33 is the first series the pack supports)
SHARED_PARTS: dict[str, str] = {}


def __getattr__(name: str):
    return release_part(__name__, name, SHARED_PARTS)
