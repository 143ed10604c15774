"""Benchmarks: agentsite measured against the SDK's own components, side by side.

`make bench` (or `DEBUG=1 .venv/bin/python -m bench`) runs every benchmark and prints one
table; `--quick` checks the harness in under a minute; `--only NAME` runs one benchmark.
docs/benchmarks.md keeps the latest results. Not part of `make test`.
"""
