"""Typed Dagster resources: where the data comes from (hub), where it goes (data root), what (profile)."""

from .alerts import AlertsResource, default_ui_url
from .hub import HubSourceResource, LoopbackHubResource
from .profile import ProfileResource
from .storage import DataRootResource, StoreTargetResource

__all__ = [
    "AlertsResource",
    "DataRootResource",
    "HubSourceResource",
    "LoopbackHubResource",
    "ProfileResource",
    "StoreTargetResource",
    "default_ui_url",
]
