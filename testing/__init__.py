"""Test tooling of the pack, apart from the product: the conformance suite (random cases of
every op against its reference), contract doubles of the vendor stacks that are not here
(``emulation.cuda``, ``emulation.rocm``, ``emulation.ascend``) and the matrix runner.

``import swa_backends``, ``select()``, ``capabilities()`` and the ops never import this
package; the CLI imports it only for ``check``, ``matrix`` and ``--emulate``. The contract
doubles put fake vendor modules into ``sys.modules`` for the duration of a ``with`` block:
never use them in a serving process.
"""
