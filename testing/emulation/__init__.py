"""Contract doubles per platform: ``emulation.<platform>.contract_doubles(device)``."""

from __future__ import annotations

import importlib


def contract_doubles(device):
    """The contract doubles of ``device``'s platform (a context manager)."""
    return importlib.import_module(f"{__name__}.{device.platform}").contract_doubles(device)
