"""The screenshots in docs/mlflow.md, taken in headless Chromium from a running `vaco ui`.

Needs Debian's chromium (`apt-get install chromium`) and Playwright's Python client
(`pip install playwright`; it drives the system browser, nothing is downloaded):

    vaco sweep --config configs/sweeps/compare_k.yaml
    vaco ui --port 5077 &
    python scripts/mlflow_screenshots.py --url http://127.0.0.1:5077 --experiment vaco-compare-k --out docs/figures
"""

from __future__ import annotations

import argparse
import json
import urllib.parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:5000")
    parser.add_argument("--experiment", default="vaco-compare-k")
    parser.add_argument("--out", default="docs/figures")
    parser.add_argument("--browser", default="/usr/bin/chromium")
    args = parser.parse_args()

    import mlflow
    from playwright.sync_api import sync_playwright

    client = mlflow.MlflowClient(args.url)
    experiment = client.get_experiment_by_name(args.experiment)
    cells = [
        r.info.run_id for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" in r.data.tags
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.browser, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 700})
        # the runs page, the sweep's parent run expanded to its cells
        page.goto(f"{args.url}/#/experiments/{experiment.experiment_id}/runs")
        page.wait_for_timeout(6000)
        page.locator("button[data-component-id*='runnamecellrenderer']").first.click()
        page.wait_for_timeout(2500)
        page.screenshot(path=f"{args.out}/mlflow_runs.png")
        # the comparison of the cells: parallel coordinates over algorithm and K against eval/return
        runs = urllib.parse.quote(json.dumps(cells))
        page.goto(
            f"{args.url}/#/compare-runs?runs={runs}&experiments={urllib.parse.quote(json.dumps([experiment.experiment_id]))}"
        )
        page.wait_for_timeout(6000)
        page.get_by_text("Clear All").click()
        boxes = page.locator(".ant-select-selector, [role='combobox']")
        for i, names in ((0, ["algorithm", "K"]), (1, ["eval/return"])):
            for name in names:
                boxes.nth(i).click()
                page.keyboard.type(name)
                page.wait_for_timeout(400)
                page.keyboard.press("Enter")
            page.keyboard.press("Escape")
        page.mouse.click(1000, 640)
        page.wait_for_timeout(2500)
        page.screenshot(path=f"{args.out}/mlflow_compare.png")
        browser.close()


if __name__ == "__main__":
    main()
