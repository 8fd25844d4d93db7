"""The chart's Grafana dashboard, run against the e2e's real Prometheus, and drawn without Grafana.

- ``queries(namespace, model_deployment, rate)``: every panel's PromQL from
  ``charts/polymorph/dashboards/polymorph-fleet.json``, with the dashboard variables replaced
  the way Grafana replaces them (``$namespace``, ``$model_deployment``, ``$__rate_interval``).
- ``capture(url, start, end)``: each query as a range query; returns the panels with their
  series (legend from the target's ``legendFormat``). ``missing(captured)`` names the queries
  that returned no finite sample (the e2e asserts there are none).
- ``page(captured)``: a static HTML page with one inline SVG plot per panel, in the dashboard's
  grid; ``python e2e/dashboard.py CAPTURE.json OUT.png`` renders it with headless Chromium
  (the picture in docs/operate.md).

It knows nothing about the fleet; it reads a Prometheus URL and the dashboard file.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

__all__ = ["DASHBOARD", "capture", "missing", "page", "queries", "screenshot"]

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "charts" / "polymorph" / "dashboards" / "polymorph-fleet.json"
)
COLORS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#ffb357", "#96d98d")


def queries(namespace: str, model_deployment: str, rate: str) -> list[dict[str, Any]]:
    """The dashboard's panels and rows, each panel with its targets' expressions resolved."""
    board = json.loads(DASHBOARD.read_text())
    values = {"namespace": namespace, "model_deployment": model_deployment, "__rate_interval": rate}
    panels = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            panels.append({"title": panel["title"], "type": "row", "grid": panel["gridPos"], "targets": []})
            continue
        targets = []
        for t in panel["targets"]:
            expr = re.sub(
                r"\$(__rate_interval|namespace|model_deployment)\b", lambda m: values[m.group(1)], t["expr"]
            )
            targets.append({"refId": t["refId"], "expr": expr, "legend": t.get("legendFormat", "")})
        config = panel.get("fieldConfig", {})
        panels.append({"title": panel["title"], "type": panel["type"], "grid": panel["gridPos"],
                       "unit": config.get("defaults", {}).get("unit", ""), "targets": targets,
                       "overrides": config.get("overrides", []),
                       "step": config.get("defaults", {}).get("custom", {}).get("lineInterpolation") == "stepAfter"})  # fmt: skip

    return panels


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def capture(url: str, start: float, end: float, step: float = 5.0, **variables: str) -> list[dict[str, Any]]:
    """Run every panel's queries over ``[start, end]``; the panels with their series."""
    panels = queries(variables.get("namespace", ".*"), variables.get("model_deployment", ".*"),
                     variables.get("rate", "30s"))  # fmt: skip
    with httpx.Client(base_url=url, timeout=30) as client:
        for panel in panels:
            for target in panel["targets"]:
                r = client.get("/api/v1/query_range",
                               params={"query": target["expr"], "start": start, "end": end, "step": step})  # fmt: skip
                r.raise_for_status()
                target["series"] = [
                    {"legend": _legend(target["legend"], s["metric"]),
                     "points": [(float(t), float(v)) for t, v in s["values"]]}
                    for s in r.json()["data"]["result"]
                ]  # fmt: skip
    return panels


def missing(captured: list[dict[str, Any]]) -> list[str]:
    """``panel / refId: expr`` of every query without one finite sample."""
    out = []
    for panel in captured:
        for t in panel["targets"]:
            if not any(math.isfinite(v) for s in t["series"] for _, v in s["points"]):
                out.append(f"{panel['title']} / {t['refId']}: {t['expr']}")
    return out


# --- drawing --------------------------------------------------------------------------------


def _fmt(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "percent":
        return f"{value:.0f}%"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _series(panel: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for t in panel["targets"]:
        yield from t["series"]


def _props(panel: dict[str, Any], legend: str) -> dict[str, Any]:
    """The panel's field overrides that apply to a series, as Grafana applies them (by regex on its name)."""
    out: dict[str, Any] = {}
    for o in panel.get("overrides", []):
        if o["matcher"]["id"] == "byRegexp" and re.fullmatch(o["matcher"]["options"], legend):
            out |= {p["id"]: p["value"] for p in o["properties"]}
    return out


def _color(panel: dict[str, Any], legend: str, n: int) -> str:
    fixed = _props(panel, legend).get("color", {}).get("fixedColor")
    return {"red": "#f2495c"}.get(fixed, fixed) if fixed else COLORS[n % len(COLORS)]


def _timeseries_svg(panel: dict[str, Any], t0: float, t1: float, width: int, height: int) -> str:
    series = [s for s in _series(panel) if any(math.isfinite(v) for _, v in s["points"])]
    right = {s["legend"] for s in series if _props(panel, s["legend"]).get("custom.axisPlacement") == "right"}
    pad_l, pad_r, top, bottom = 56, 48 if right else 14, 8, 22
    w, h = width - pad_l - pad_r, height - top - bottom

    def scale(group: list[dict[str, Any]], fixed_max: float | None = None) -> tuple[float, float]:
        values = [v for s in group for _, v in s["points"] if math.isfinite(v)]
        lo, hi = (min(0.0, *values), max(values)) if values else (0.0, 1.0)
        hi = fixed_max if fixed_max is not None else hi + (hi - lo) * 0.08
        return lo, hi if hi > lo else lo + 1.0

    left_s = [s for s in series if s["legend"] not in right]
    right_s = [s for s in series if s["legend"] in right]
    axes = {"left": scale(left_s), "right": scale(right_s, 100.0 if right_s else None)}

    def x(t: float) -> float:
        return pad_l + (t - t0) / max(1.0, t1 - t0) * w

    def y(v: float, axis: str = "left") -> float:
        lo, hi = axes[axis]
        return top + h - (v - lo) / (hi - lo) * h

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):
        lo, hi = axes["left"]
        v = lo + (hi - lo) * i / 4
        parts.append(
            f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#2c3235"/>'
        )
        parts.append(
            f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="tick">{html.escape(_fmt(v, panel["unit"]))}</text>'
        )
        if right:
            rlo, rhi = axes["right"]
            rv = rlo + (rhi - rlo) * i / 4
            parts.append(
                f'<text x="{pad_l + w + 6}" y="{y(rv, "right") + 4:.1f}" class="tick">{rv:.0f}%</text>'
            )
    for i in range(5):
        t = t0 + (t1 - t0) * i / 4
        anchor = "start" if i == 0 else ("end" if i == 4 else "middle")
        parts.append(
            f'<text x="{x(t):.1f}" y="{height - 6}" text-anchor="{anchor}" class="tick">{int(t - t0) // 60}m{int(t - t0) % 60:02d}s</text>'
        )
    for n, s in enumerate(series):
        axis = "right" if s["legend"] in right else "left"
        dash = ' stroke-dasharray="8 6"' if "custom.lineStyle" in _props(panel, s["legend"]) else ""
        path, prev = [], None
        for t, v in s["points"]:
            if not math.isfinite(v):
                prev = None
                continue
            if prev is None:
                path.append(f"M{x(t):.1f},{y(v, axis):.1f}")
            elif panel.get("step"):
                path.append(f"H{x(t):.1f}V{y(v, axis):.1f}")
            else:
                path.append(f"L{x(t):.1f},{y(v, axis):.1f}")
            prev = v
        parts.append(
            f'<path d="{" ".join(path)}" fill="none" stroke="{_color(panel, s["legend"], n)}" stroke-width="2"{dash}/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _timeline_svg(panel: dict[str, Any], t0: float, t1: float, width: int, height: int) -> str:
    """A state timeline: one band per deployment, each stretch coloured by the phase whose series is 1."""
    pad_l, top = 56, 10
    w = width - pad_l - 14
    band = min(46.0, height * 0.5)
    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    step = min(
        (b - a for s in _series(panel) for (a, _), (b, _) in zip(s["points"], s["points"][1:], strict=False)),
        default=5.0,
    )
    for n, s in enumerate(_series(panel)):
        color = _color(panel, s["legend"], n)
        for t, v in s["points"]:
            if v == 1:
                x = pad_l + (t - t0) / max(1.0, t1 - t0) * w
                parts.append(
                    f'<rect x="{x:.1f}" y="{top}" width="{step / max(1.0, t1 - t0) * w + 0.6:.1f}" height="{band:.0f}" fill="{color}"/>'
                )
    md = next((s["legend"].split()[0] for s in _series(panel)), "")
    parts.append(
        f'<text x="{pad_l - 6}" y="{top + band / 2 + 4:.0f}" text-anchor="end" class="tick">{html.escape(md)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def page(captured: list[dict[str, Any]], title: str = "Polymorph fleet") -> str:
    """The dashboard as a static page: its panels in Grafana's 24-column grid, plotted as SVG.

    The layout, legends and overrides come from the dashboard file; the series from ``captured``
    (matched by panel title and refId)."""
    got = {(p["title"], t["refId"]): t["series"] for p in captured for t in p["targets"]}
    panels = queries(".*", ".*", "30s")
    for panel in panels:
        for t in panel["targets"]:
            t["series"] = got.get((panel["title"], t["refId"]), [])
    times = [t for p in panels for s in _series(p) for t, _ in s["points"]]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    col, rowh = 66, 34
    cells = []
    for panel in panels:
        g = panel["grid"]
        style = f"left:{g['x'] * col}px;top:{g['y'] * rowh}px;width:{g['w'] * col - 8}px"
        if panel["type"] == "row":
            cells.append(f'<div class="row" style="{style}">{html.escape(panel["title"])}</div>')
            continue
        labels = [s["legend"] for s in _series(panel)]
        lines = max(1, math.ceil(sum(len(t) * 6.2 + 30 for t in labels) / (g["w"] * col - 20)))
        width, height = g["w"] * col - 12, g["h"] * rowh - 44 - 15 * lines
        draw = _timeline_svg if panel["type"] == "state-timeline" else _timeseries_svg
        legend = "".join(
            f'<span><i style="background:{_color(panel, s["legend"], n)}"></i>'
            f"{html.escape(s['legend'].split()[-1] if panel['type'] == 'state-timeline' else s['legend'])}</span>"
            for n, s in enumerate(_series(panel))
        )
        cells.append(
            f'<div class="panel" style="{style};height:{g["h"] * rowh - 8}px">'
            f'<h3>{html.escape(panel["title"])}</h3>{draw(panel, t0, t1, width, height)}<div class="legend">{legend}</div></div>'
        )
    bottom = max((p["grid"]["y"] + p["grid"]["h"]) for p in panels) * rowh
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body {{ background:#111217; color:#ccccdc; font:13px Inter, 'DejaVu Sans', sans-serif; margin:0; padding:12px; }}
h1 {{ font-size:18px; margin:4px 4px 12px; font-weight:500; }} h1 small {{ color:#8e8e8e; font-size:12px; margin-left:12px; }}
.grid {{ position:relative; height:{bottom}px; }}
.row {{ position:absolute; font-size:14px; font-weight:500; color:#d8d9da; padding:8px 2px 0; }}
.panel {{ position:absolute; background:#181b1f; border:1px solid #2c3235; border-radius:3px; padding:4px 6px; box-sizing:border-box; overflow:hidden; }}
.panel h3 {{ margin:2px 0 4px; font-size:13px; font-weight:500; }}
.tick {{ fill:#8e8e8e; font-size:10px; }}
.legend {{ font-size:11px; }} .legend span {{ margin-right:12px; white-space:nowrap; }}
.legend i {{ display:inline-block; width:12px; height:3px; margin-right:4px; vertical-align:middle; }}
</style></head><body><h1>{html.escape(title)}<small>the chart's dashboard queries, run against the e2e's Prometheus</small></h1>
<div class="grid">{"".join(cells)}</div></body></html>"""


def screenshot(html_text: str, out: Path, width: int = 1620, height: int = 1280) -> None:
    """Render a page to PNG with headless Chromium (Debian's ``chromium``)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise RuntimeError("no chromium on PATH; apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "page.html"
        src.write_text(html_text)
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={width},{height}", f"--screenshot={out.resolve()}", src.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python e2e/dashboard.py CAPTURE.json OUT.png", file=sys.stderr)
        return 2
    captured = json.loads(Path(argv[0]).read_text())
    text = page(captured)
    Path(argv[1]).with_suffix(".html").write_text(text)
    screenshot(text, Path(argv[1]))
    print(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
