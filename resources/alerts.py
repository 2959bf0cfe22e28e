"""Where alerts go: a JSON Lines file under the instance and, when configured, a webhook."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field


class AlertsResource(dg.ConfigurableResource):
    """Delivers an alert (a JSON object) to ``jsonl_path`` (default ``$DAGSTER_HOME/alerts/alerts.jsonl``)
    and, when ``webhook_url`` is set, as an HTTP POST with a JSON body."""

    jsonl_path: str | None = Field(default=None, description="alerts file; default under DAGSTER_HOME")
    webhook_url: str | None = Field(default=None, description="POST each alert here as JSON (optional)")
    timeout_seconds: float = Field(default=10.0)

    def alerts_file(self) -> Path:
        if self.jsonl_path:
            return Path(self.jsonl_path)
        home = os.environ.get("DAGSTER_HOME") or "."
        return Path(home) / "alerts" / "alerts.jsonl"

    def deliver(self, alert: dict[str, Any]) -> None:
        alert = {"delivered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **alert}
        path = self.alerts_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(alert, sort_keys=True) + "\n"
        with open(path, "a", encoding="utf-8") as f:  # one write per line: appends stay whole
            f.write(line)
        if self.webhook_url:
            req = urllib.request.Request(
                self.webhook_url,
                data=json.dumps(alert).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=self.timeout_seconds) as resp:
                resp.read()
