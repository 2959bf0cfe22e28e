"""The package list, the one setting pyproject.toml cannot express: the library's subpackages are found
(add a folder under stage2_data/ and it ships), and the Dagster layer's top-level folders are
installed under the names given in pyproject.toml's [tool.setuptools.package-dir]. Everything else
is in pyproject.toml.
"""

from setuptools import find_packages, setup

LAYER_PACKAGES = [
    "stage2_assets",
    "stage2_resources",
    "stage2_pipelines",
    "stage2_deploy",
    "stage2_deploy.k8s",
]

setup(packages=[*find_packages(include=["stage2_data", "stage2_data.*"]), *LAYER_PACKAGES])
