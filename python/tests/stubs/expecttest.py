"""A minimal stand-in for the expecttest package (not in Debian), which torch's test utilities
import: its TestCase adds assertExpectedInline, which the distributed tests do not use."""
import unittest

ACCEPT = False  # expecttest: whether to rewrite expected outputs (never here)


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (expecttest's name)
        self.assertEqual(str(actual).strip(), str(expect).strip())
