"""Exceptions of the pack.

Invalid input is a plain ``ValueError`` (SPEC §5); these subclasses add what a caller
needs to act on a failed *selection* or *matrix* load.
"""

from __future__ import annotations


class SelectionError(RuntimeError):
    """No variant (or not the forced one) can run an op on this device.

    ``reasons`` maps ``variant name -> [reasons]`` so a caller can print all of them.
    """

    def __init__(self, message: str, reasons: dict[str, list[str]] | None = None):
        self.reasons = dict(reasons or {})
        if self.reasons:
            lines = [message]
            for name, why in self.reasons.items():
                lines.append(f"  {name}: " + ("; ".join(why) if why else "ok"))
            message = "\n".join(lines)
        super().__init__(message)


class MatrixError(ValueError):
    """matrix.yaml (or a matrix passed in) is malformed or names something unknown."""


class KernelUnavailable(RuntimeError):
    """A variant's kernel cannot be built for a call (its compiler failed on it).

    Raised by a variant's implementation *before it writes anything*; dispatch then runs the
    next variant of the op's chain. ``whole_variant`` (the default): the failure does not
    depend on the call (e.g. the installed Triton cannot build the kernel at all), so dispatch
    skips the variant from then on and shows the failure as its reason in
    ``Backend.explain()``. ``whole_variant=False``: only this call's specialisation (a shape,
    a record format) failed; the kernel remembers it and raises again at once for the same
    specialisation, and every other call still gets the variant.
    """

    def __init__(self, *args, whole_variant: bool = True):
        super().__init__(*args)
        self.whole_variant = whole_variant
