"""Pure-numpy comparison: statistics and verdicts. Knows nothing of runtimes."""
