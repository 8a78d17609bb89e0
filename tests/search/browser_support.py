"""The browser the page tests drive: Debian's chromium through Debian's chromium-driver, with Selenium
pointed at /usr/bin/chromedriver (it never downloads a driver); `make test` installs both with apt when they
are missing. Without them a test asking for ``browser`` skips, except under CI, where it fails. A test module
takes the fixture ``browser`` with ``from browser_support import browser_fixture  # noqa: F401``."""

from __future__ import annotations

import os
import shutil

import pytest

from ci_guard import IN_CI

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
    "--force-device-scale-factor=1",
]


def require_browser() -> None:
    if os.path.exists(CHROMEDRIVER) and os.path.exists(CHROMIUM):
        return
    message = (
        f"{CHROMEDRIVER} / {CHROMIUM} missing: `make test` installs chromium and chromium-driver with apt"
    )
    if IN_CI:  # the suite must exercise the web page there (tests/ci_guard.py)
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(name="browser")
def browser_fixture(tmp_path, monkeypatch):
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never fetch anything
    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "profile"
    profile.mkdir()
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)  # generous: the other test process may be busy
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(browser, url: str, address: str = "/"):
    """Load the page (at ``address``: ``/?q=...`` searches once loaded) and wait until it has read the
    server's settings (``max_k``, the default ``k``): a box cleared before they arrive would be filled in
    under the test's typing. Returns a 120 s ``WebDriverWait`` (generous: the other test process may be
    busy)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url + address)
    wait = WebDriverWait(browser, 120)
    wait.until(lambda d: d.execute_script("return !!window.patchword && window.patchword.maxK !== null"))
    return wait


def submit(browser, query: str, k: int | str | None = None) -> None:
    """Type ``query`` (and ``k``, when given) into the page's boxes and press Enter."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element(By.ID, "q")
    box.clear()
    box.send_keys(query)
    if k is not None:
        k_box = browser.find_element(By.ID, "k")
        k_box.clear()
        k_box.send_keys(str(k))
    box.send_keys(Keys.ENTER)
