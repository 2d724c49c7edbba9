"""Drives JupyterLab in Debian's Chromium through Selenium, as a user would click it.

The browser and its driver are the system's (`apt install chromium chromium-driver`):
nothing is downloaded, Selenium Manager is kept offline.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def why_no_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} missing: run `make deps` (Debian's chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium missing: run `make deps`"
    return None


def make_driver(download_dir: Path | None = None):
    os.environ["SE_OFFLINE"] = "true"  # never let Selenium Manager fetch a browser or driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # Headless, as root on a CI machine without a display; /dev/shm may be small.
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,900"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    return driver


def _wait(driver, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout)


def log_in(driver, url: str, password: str, timeout: float = 60) -> bool:
    """Open `url`, type the password on Jupyter's login page; True once JupyterLab's shell
    shows, False if the browser is still on the login page."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    driver.get(url)
    box = _wait(driver, timeout).until(ec.presence_of_element_located((By.ID, "password_input")))
    box.clear()
    box.send_keys(password)
    driver.find_element(By.ID, "login_submit").click()
    try:
        _wait(driver, timeout).until(lambda d: "/login" not in d.current_url or d.find_elements(By.CSS_SELECTOR, ".alert, .message"))
        if "/login" in driver.current_url:
            return False
        _wait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#jp-main-dock-panel")))
        return True
    except TimeoutException:
        return False


def login_message(driver) -> str:
    from selenium.webdriver.common.by import By

    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, ".alert, .message") if e.text)


def run_in_new_notebook(driver, code: str, until_text: list[str], timeout: float = 180) -> str:
    """From the Launcher: a new notebook on the default kernel, `code` typed into its first
    cell and run with Shift+Enter; returns the cell's output once it holds every string
    of `until_text` (or what it holds at the timeout)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec

    card_css = (By.CSS_SELECTOR, '.jp-LauncherCard[data-category="Notebook"]')
    try:
        card = _wait(driver, 20).until(ec.element_to_be_clickable(card_css))
    except TimeoutException:  # a restored workspace shows no Launcher: open one, as the "+" button does
        driver.find_element(By.CSS_SELECTOR, '[data-command="launcher:create"]').click()
        card = _wait(driver, 60).until(ec.element_to_be_clickable(card_css))
    card.click()
    editor = _wait(driver, 60).until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content"))
    )
    # The kernel must be idle before the cell runs, or Shift+Enter queues behind its start.
    _wait(driver, 120).until(
        lambda d: d.find_elements(
            By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator[data-status='idle']"
        )
    )
    editor.click()
    editor.send_keys(code)
    editor.send_keys(Keys.SHIFT, Keys.ENTER)

    def output(d) -> str:
        return "\n".join(e.text for e in d.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output"))

    def first_prompt(d) -> str:
        prompts = d.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-InputPrompt")
        return prompts[0].text.strip() if prompts else ""

    # A kernel that reports idle while its channels still settle can drop the first
    # execute request (the cell keeps an empty "[ ]:" prompt on a loaded machine): the
    # cell is run again in place, as a user would press Ctrl+Enter once more.
    for _ in range(3):
        try:
            _wait(driver, 20).until(lambda d: first_prompt(d) not in ("", "[ ]:"))
            break
        except TimeoutException:
            first = driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content")
            first.click()
            first.send_keys(Keys.CONTROL, Keys.ENTER)

    try:
        _wait(driver, timeout).until(lambda d: all(t in output(d) for t in until_text))
    except TimeoutException:
        pass
    return output(driver)


def screenshot(driver, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path
