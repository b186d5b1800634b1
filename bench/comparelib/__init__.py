"""Helpers of bench/compare: runner (finding and running the instruments) and report."""
