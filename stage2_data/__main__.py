"""``python -m stage2_data``: the ``stage2`` command, for an environment without its script on PATH."""

from .cli import run

run()
