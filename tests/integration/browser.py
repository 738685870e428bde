"""A real headless Chromium (Debian's `chromium` and its version-matched `chromium-driver`) driven through
Selenium, for the console's tests. Nothing is downloaded: the browser and the driver are the system's, and
Selenium Manager is told to stay offline. Screenshots go to build/screenshots/, the run's test artifacts (kept
after it; `.ci/run` lists them)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from apps.dev.checkout import REPO_ROOT

CHROMIUM = os.environ.get("KI_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("KI_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = REPO_ROOT / "build" / "screenshots"

# Without the background-networking flags Chromium keeps calling home, which a closed network refuses.
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--window-size=1280,900", "--lang=de-DE",
)  # fmt: skip


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a browser or a driver
    profile = tempfile.mkdtemp(prefix="ki-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
