"""The test suite (a package, so its modules import `tests.support` by name)."""
