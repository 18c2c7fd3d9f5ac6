"""Take docs/img/playground.png: the playground page of a real ``omni serve`` (the embedded
defaults) in headless chromium, after it drew an image.

    python scripts/screenshot_playground.py            # needs playwright and Debian's chromium

The picture shows the tiny model's output: random weights draw noise, which is what the page
shows a new user who runs the same commands.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from serving import start_server  # noqa: E402

OUT = REPO / "docs" / "img" / "playground.png"


def main() -> int:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as home:
        server = start_server([], home=Path(home))
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 900, "height": 760}, device_scale_factor=1)
                page.goto(server.url + "/")
                page.fill("#image-prompt", "a red fox in snow")
                page.fill("#image-seed", "3")
                page.fill("#image-size", "256x256")
                page.click("#image-generate")
                page.wait_for_function("document.querySelector('#image-result')?.naturalWidth > 0", timeout=120_000)
                page.screenshot(path=str(OUT), full_page=True)
                browser.close()
        finally:
            server.stop()
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
