"""A stand-in for the expecttest package (not in Debian), with only what torch 1.13's
torch.testing._internal.common_utils uses: ACCEPT and TestCase."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertEqual(actual, expect)
