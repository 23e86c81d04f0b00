"""Helpers only the tests use: a fake clock, a node of a test module's own, and a test module
run by an inner pytest (holds_servers.py)."""
