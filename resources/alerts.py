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


def default_ui_url() -> str:
    """The UI's address for run links: ``STAGE2_UI_URL`` (`make ui` sets it to its own port)."""
    return os.environ.get("STAGE2_UI_URL", "http://127.0.0.1:3000")


class AlertsResource(dg.ConfigurableResource):
    """Delivers an alert (a JSON object) to ``jsonl_path`` (default ``$DAGSTER_HOME/alerts/alerts.jsonl``)
    and, when ``webhook_url`` is set, as an HTTP POST with a JSON body."""

    jsonl_path: str | None = Field(default=None, description="alerts file; default under DAGSTER_HOME")
    webhook_url: str | None = Field(default=None, description="POST each alert here as JSON (optional)")
    ui_url: str = Field(
        default_factory=lambda: default_ui_url(),
        description="base URL of the Dagster UI, for run links in alerts (env STAGE2_UI_URL)",
    )
    timeout_seconds: float = Field(default=10.0)

    def alerts_file(self) -> Path:
        if self.jsonl_path:
            return Path(self.jsonl_path)
        home = os.environ.get("DAGSTER_HOME") or "."
        return Path(home) / "alerts" / "alerts.jsonl"

    def run_link(self, run_id: str) -> str:
        return f"{self.ui_url.rstrip('/')}/runs/{run_id}"

    def deliver(self, alert: dict[str, Any]) -> str | None:
        """Append the alert to the JSONL file, then POST it to the webhook (if any).

        Returns None, or a one-line reason when the webhook could not be reached (the alert is in the
        file either way; a dead webhook must not stop the sensor or re-send older alerts)."""
        alert = {"delivered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **alert}
        path = self.alerts_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(alert, sort_keys=True) + "\n"
        with open(path, "a", encoding="utf-8") as f:  # one write per line: appends stay whole
            f.write(line)
        if not self.webhook_url:
            return None
        req = urllib.request.Request(
            self.webhook_url,
            data=json.dumps(alert).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_seconds) as resp:
                resp.read()
        except OSError as e:  # URLError, HTTPError, timeouts
            return (
                f"webhook {self.webhook_url} failed: {type(e).__name__}: {e}; the alert is kept in "
                f"{path}. Fix: check that the webhook answers a JSON POST there (STAGE2_ALERT_WEBHOOK), "
                "or unset it to keep alerts in the file only"
            )
        return None
