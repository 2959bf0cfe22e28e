"""Plain helpers shared by the test modules (no fixtures: those are plugins under tests/fixtures/).

- ``helpers.cli``: run ``stage2 …`` (or a Python snippet) as a subprocess, the one way every test does.
- ``helpers.env``: set environment variables for a block (session fixtures), a free loopback port.
- ``helpers.faults``: the fault matrix's machinery (tests/test_faults_*.py; the rows are in
  tests/faults_table.py).
- ``helpers.kit``: a tiny, real data root and kit for the kit tests (tests/test_kit*.py).
"""
