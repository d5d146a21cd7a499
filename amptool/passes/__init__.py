"""Relax passes and the one place their order lives (``pipeline``)."""
