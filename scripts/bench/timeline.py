"""How fast a run's timeline.html opens and zooms in headless Chromium, as JSON.

    python scripts/bench/timeline.py RUN_OUT_DIR [--repeat 3]

RUN_OUT_DIR holds an analysed run's timeline.html and report.html (rmq-analyze writes both). Each
repeat loads the page in a fresh browser page and reads the browser's own performance timings: the
load event, and the time until the canvas was first painted (``paint_ms``); then it zooms 20 times
around the middle of the chart and times each repaint (``zoom_frame_ms``: median and worst). The
baseline, measured the same way in the same browser, is the run's report.html (its load event).
Goals (issue "answers while you watch"): the 1,000-consumer, 600 s simulated run opens in under 3 s
and zooms without a visible stall (a frame well under 100 ms).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ZOOM_FRAMES = """(() => { const v = window.timeline.view, out = [];
    let [a, b] = v; const mid = (a + b) / 2;
    for (let i = 0; i < 20; i++) { a = mid - (mid - a) * 0.8; b = mid + (b - mid) * 0.8;
      window.timeline.view = [a, b]; const t = performance.now(); window.timeline.paint();
      out.push(performance.now() - t); }
    return out; })()"""


def measure(page: Any, path: Path, zoom: bool) -> dict[str, Any]:
    page.goto(path.as_uri(), wait_until="load")
    nav = page.evaluate(
        "(() => { const n = performance.getEntriesByType('navigation')[0];"
        " return {load_ms: n.loadEventEnd, dom_ms: n.domContentLoadedEventEnd}; })()"
    )
    out: dict[str, Any] = {"load_ms": round(nav["load_ms"], 1), "dom_ms": round(nav["dom_ms"], 1)}
    if zoom:
        out["paint_ms"] = round(
            page.evaluate(
                "(() => { const t = performance.now(); window.timeline.paint();"
                " return performance.now() - t; })()"
            )
            + nav["load_ms"],
            1,
        )
        frames = page.evaluate(ZOOM_FRAMES)
        out["zoom_frame_ms"] = {"median": round(statistics.median(frames), 2), "max": round(max(frames), 2)}
        out["rows"] = page.evaluate("window.timeline.rows()")
        # Every broker unfolded (a large run opens folded): the frames with all rows laid out.
        page.evaluate("(b => b.textContent === 'unfold all' && b.click())(document.getElementById('fold'))")
        page.keyboard.press("0")
        frames = page.evaluate(ZOOM_FRAMES)
        out["unfolded_rows"] = page.evaluate("window.timeline.rows()")
        out["unfolded_zoom_frame_ms"] = {
            "median": round(statistics.median(frames), 2),
            "max": round(max(frames), 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("headless Chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    page_file, baseline_file = args.out_dir / "timeline.html", args.out_dir / "report.html"
    result: dict[str, Any] = {
        "timeline_bytes": page_file.stat().st_size,
        "report_bytes": baseline_file.stat().st_size,
        "runs": [],
    }
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for _ in range(args.repeat):
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                timeline = measure(page, page_file, zoom=True)
                page.close()
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                baseline = measure(page, baseline_file, zoom=False)
                page.close()
                result["runs"].append({"timeline": timeline, "baseline_report": baseline})
        finally:
            browser.close()
    loads = [r["timeline"]["paint_ms"] for r in result["runs"]]
    result["timeline_open_ms_median"] = statistics.median(loads)
    result["baseline_report_load_ms_median"] = statistics.median(
        r["baseline_report"]["load_ms"] for r in result["runs"]
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
