"""A stand-in for the expecttest package (not in Debian, not required by pip's torch), with
only what torch.testing._internal.common_utils uses (torch 1.13's and 2.13's): ACCEPT and
TestCase."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertEqual(actual, expect)
