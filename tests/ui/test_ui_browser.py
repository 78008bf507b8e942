"""Real browser: `grpolab ui` on a free port, Debian's Chromium driven by Playwright (slow marker).

Skipped when /usr/bin/chromium or the playwright package is missing (Playwright downloads no
browser here: it is pointed at the system one). The first load of a cold Streamlit server shows
only a skeleton, so the test waits for the plotly chart itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"grpolab ui exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


def test_compare_page_renders_in_chromium(ui_root: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs the playwright package (pip install playwright)"
    )
    root = tmp_path / "runs"
    for src, name in (("a", "seed-1234"), ("b", "seed-7")):
        shutil.copytree(ui_root / src, root / name)
    port = _free_port()
    log = open(tmp_path / "ui.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpolab", "ui", str(root), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        assert f"at {url}" in (tmp_path / "ui.log").read_text()
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(CHROMIUM),
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
            )  # fmt: skip
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(url + "/compare", timeout=60_000)
            page.wait_for_selector(".js-plotly-plot", timeout=90_000)
            page.wait_for_selector("text=First divergence step", timeout=30_000)
            shot = tmp_path / "compare.png"
            page.screenshot(path=str(shot), full_page=True)
            html = page.content()
            charts = page.locator(".js-plotly-plot").count()
            browser.close()
        assert charts >= 1
        assert "seed-1234" in html and "seed-7" in html  # the run ids (multiselect, legends)
        assert "rollout/raw_reward" in html
        assert shot.stat().st_size > 20_000, "screenshot looks like the empty skeleton"
        keep = os.environ.get("GRPOLAB_UI_SCREENSHOT")
        if keep:
            shutil.copy(shot, keep)
    finally:
        proc.terminate()  # grpolab ui passes SIGTERM on to Streamlit
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    with pytest.raises(OSError):  # nothing is left serving on the port
        urllib.request.urlopen(url + "/_stcore/health", timeout=2)
