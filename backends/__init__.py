"""Per-platform backends. Each subpackage declares, as data, the variants it registers
(``VARIANTS``) and its dispatch priority per op (``PRIORITY``); importing one imports no
vendor package."""
