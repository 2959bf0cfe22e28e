"""Write the benchmark table from bench/results.json into README.md (between the bench markers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.run import render_table

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    readme = REPO / "README.md"
    doc = json.loads((REPO / "bench" / "results.json").read_text())
    text = re.sub(
        r"<!-- bench:begin -->\n.*?<!-- bench:end -->",
        lambda _: f"<!-- bench:begin -->\n{render_table(doc)}\n<!-- bench:end -->",
        readme.read_text(),
        flags=re.S,
    )
    readme.write_text(text)


if __name__ == "__main__":
    main()
