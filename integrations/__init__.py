"""Serving-engine integrations of swa_backends.

The top layer of the pack: an integration may import ``swa_backends.dispatch``,
``swa_backends.common`` and ``swa_backends.torch_ops``; nothing else in the pack imports
an integration, and ``import swa_backends`` imports none (no serving engine is imported
with the pack). ``swa_backends.integrations.vllm`` runs DeepSeek-V4.1's replay metadata
inside vLLM through the pack; ``swa_backends.plugin.register()`` installs it.
"""
