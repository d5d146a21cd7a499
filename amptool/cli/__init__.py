"""Command-line shell: one thin module per command; the only place that prints."""
