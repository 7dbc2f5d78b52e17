"""Render deploy/grafana/retrytopics.json's panels from a Prometheus with matplotlib: a picture of the dashboard
from real series where no Grafana server runs (docs/operations.md shows one).

    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --minutes 5 --out dashboard.png

Every variable is taken at All; `$__rate_interval` is 1 m. A stat panel shows its last value, a time series
panel its lines.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import urlopen

DASHBOARD = Path(__file__).with_name("retrytopics.json")


def concrete(expr: str, rate_window: str = "1m") -> str:
    """A panel's query as Grafana sends it with every variable at All."""
    return re.sub(r"\$(job|group|topic)\b", ".*", expr.replace("$__rate_interval", rate_window))


def query_range(prometheus: str, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
    params = urlencode({"query": expr, "start": start, "end": end, "step": step_s})
    with urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.loads(answer.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return list(body["data"]["result"])


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template) or "value"


def render(prometheus: str, out: Path, *, minutes: float, end: float | None = None) -> int:
    """Draw every panel over the last `minutes`; returns how many panels' queries answered with a series (one
    whose values are all NaN, e.g. a quantile of no observations in its window, is drawn as no data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    end = time.time() if end is None else end
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 200)
    columns = 3
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    answered = 0
    for axis, panel in zip(axes.flat, panels, strict=False):
        axis.set_title(panel["title"], fontsize=11, loc="left")
        drawn = found = False
        for target in panel.get("targets", []):
            for series in query_range(prometheus, concrete(target["expr"]), start, end, step):
                found = True
                points = [(float(t) - end, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if not points:
                    continue
                drawn = True
                label = _legend(target.get("legendFormat", ""), series["metric"])
                if panel["type"] == "stat":
                    axis.text(0.5, 0.45, f"{points[-1][1]:.3g}", fontsize=30, ha="center", va="center")
                    axis.text(0.5, 0.1, label, fontsize=9, ha="center", transform=axis.transAxes)
                    axis.set_axis_off()
                    break
                axis.plot([t / 60 for t, _ in points], [v for _, v in points], label=label[:40])
        if drawn and panel["type"] != "stat":
            axis.legend(fontsize=7, loc="upper left")
            axis.set_xlabel("minutes ago", fontsize=8)
            axis.set_ylabel(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""), fontsize=8)
        if not drawn:
            axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
        answered += found
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_axis_off()
    figure.suptitle("retrytopics (deploy/grafana/retrytopics.json, rendered from Prometheus)", fontsize=13)
    figure.tight_layout()
    figure.savefig(out, dpi=80)
    plt.close(figure)
    return answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base address, e.g. http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"))
    args = parser.parse_args()
    print(f"{render(args.prometheus, args.out, minutes=args.minutes)} panels answered: {args.out}")


if __name__ == "__main__":
    main()
