"""TEST-ONLY stand-in (see habana_frameworks/__init__.py)."""
