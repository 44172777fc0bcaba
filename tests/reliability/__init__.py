"""Reliability tests: faults, hostile clients and input, load, corrupt records, security."""
