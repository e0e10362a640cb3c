"""Worked examples built on the pack (not part of the installed package)."""
