"""The contract every backend implements: metadata types, validation, the device model, the
platform protocol and registry (``platforms``), the variant declarations (``registry``), the
matrix loader, and every op: its torch reference and its other facts (``ops``, one ``OpSpec``
per op)."""
