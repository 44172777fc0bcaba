"""Unit tests: one piece at a time, in-process and fast, with no job or dashboard around it."""
