"""Helpers shared by every test directory (imported as `tests.support.<module>`)."""
