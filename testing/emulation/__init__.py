"""Contract doubles per platform: ``emulation.<platform>.contract_doubles(device)``, the module
each platform names in its ``Platform.emulation``."""

from __future__ import annotations

import importlib

from ...common.platforms import get_platform


def contract_doubles(device):
    """The contract doubles of ``device``'s platform (a context manager)."""
    p = get_platform(device.platform)
    if p is None or p.emulation is None:
        raise ValueError(f"contract_doubles: device={device}: expected a device of a platform with contract doubles "
                         f"(its platform declares none)")
    return importlib.import_module(p.emulation).contract_doubles(device)
