"""The deployment configuration, installed with the package as ``stage2_deploy`` (package data):
``dagster.yaml`` (the production instance on PostgreSQL) and ``k8s/`` (the Kubernetes executor,
instance and data-root volume). ``stage2_pipelines`` reads ``k8s/executor.yaml`` from here when
``STAGE2_K8S_EXECUTOR_CONFIG`` is not set.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def path(name: str) -> Path:
    """The installed file ``name`` of the deployment configuration, e.g. ``k8s/executor.yaml``."""
    return Path(str(files(__name__).joinpath(*name.split("/"))))
