"""The application layer: each verb as a library function over a frozen config
(convert, diff, inspect, bench, run), and what they share (artifacts, output directories,
calibration, per-layer probes, auto-fallback). The CLI and ``amptool.api`` call into it."""
