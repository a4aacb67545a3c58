"""The dashboard in a real browser (Debian's headless Chromium through chromedriver) during a
real run on real workers: progress moves without a reload, pause is confirmed with the token,
and the run shows as paused. A screenshot taken during the run is kept as a test artifact
(``test-artifacts/dashboard.png``, or ``$FARM_TEST_ARTIFACTS/dashboard.png``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from farmcore.ledger import ChunkSpec
from jobs import runs
from tests.conftest import ROOT, SHARDS_A, run_farm
from tests.dashkit import TOKEN, dashboard
from tests.farmkit import start_workers, stop, until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("park_leftover_runs")]

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1500,1100")


def artifacts() -> Path:
    """Where the test's screenshot goes."""
    path = Path(os.environ.get("FARM_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium with a fresh profile; a missing browser FAILS the test (never skips)."""
    missing = [p for p in (CHROMIUM, DRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: the dashboard's browser test needs "
                    "Debian's chromium and chromium-driver (apt-get install -y chromium "
                    "chromium-driver; .ci/run installs them)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def row_attr(driver, run_id: str, name: str) -> str | None:
    """An attribute of the run's row as the page shows it now (the row is swapped every 2 s)."""
    return driver.execute_script(
        "var r = document.querySelector('tr.run[data-run=\"' + arguments[0] + '\"]');"
        "return r ? r.getAttribute(arguments[1]) : null;", run_id, name)


def text_of(driver, element_id: str) -> str:
    """The text of an element of the live part now (read in one step: it is replaced)."""
    return driver.execute_script("var e = document.getElementById(arguments[0]);"
                                 "return e ? e.innerText : '';", element_id)


def click(driver, css: str) -> bool:
    """Click the element now matching ``css`` (found afresh: the live part is replaced)."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.common.by import By
    try:
        driver.find_element(By.CSS_SELECTOR, css).click()
        return True
    except (StaleElementReferenceException, NoSuchElementException):
        return False


def test_progress_moves_live_then_pause_is_confirmed(rt, env, browser, tmp_path):
    from selenium.webdriver.common.by import By
    chunks = [ChunkSpec("edges", {"shard": SHARDS_A[0] + 5, "start": 9_000_000 + i * 200,
                                  "count": 200, "pause": 0.2}, rows=200) for i in range(150)]
    out = run_farm(env, "export", "--date", "2026-11-20", "--tables", "pins", "--dest",
                   f"file://{tmp_path / 'exports'}")  # queued first: its 16 chunks run first
    assert out.returncode == 0, out.stderr
    run_id = runs.start(rt, "test", "tests.kinds.write_edges", chunks)
    with dashboard({**env, "FARM_DASHBOARD_TOKEN": TOKEN}, "--allow-actions") as (url, dash):
        browser.get(url)
        assert row_attr(browser, run_id, "data-rows") == "0"  # no worker yet
        browser.execute_script("window.notReloaded = true;")
        workers = start_workers(env, 2)
        try:
            first = int(until(lambda: int(row_attr(browser, run_id, "data-rows") or 0),
                              what="rows to show up"))
            until(lambda: int(row_attr(browser, run_id, "data-rows") or 0) > first,
                  what="progress to move again")
            until(lambda: f"run {run_id} chunk" in text_of(browser, "workers"),
                  what="a worker shown with its chunk")
            until(lambda: "✓" in text_of(browser, "exports"),
                  what="the export's _SUCCESS in the calendar")
            assert (tmp_path / "exports/pins/dt=2026-11-20/_SUCCESS").exists()
            assert browser.execute_script("return window.notReloaded === true;")
            browser.save_screenshot(str(artifacts() / "dashboard.png"))
            # clicked until the confirm step shows: a click can land on a button the live
            # part replaces at that instant (it then does nothing), or be followed by a read
            # of the page before the browser navigated (confirming is a GET: safe to repeat)
            pause = f'tr.run[data-run="{run_id}"] button.act-pause'
            until(lambda: text_of(browser, "what") or (click(browser, pause) and None),
                  what="the confirm step after clicking pause")
            assert run_id in browser.find_element(By.ID, "what").text  # the confirm step
            assert rt.ledger.run(run_id)["paused"] is False
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.ID, "confirm").click()
            until(lambda: row_attr(browser, run_id, "data-state") == "paused",
                  what="the run shown paused")
            assert rt.ledger.run(run_id)["paused"] is True
            assert f"paused {run_id}" in browser.find_element(By.ID, "note").text
            assert TOKEN not in browser.page_source
        finally:
            stop(workers)
    assert TOKEN not in dash.output
