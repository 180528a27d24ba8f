"""The web console in a real headless Chromium (Debian's chromium and chromium-driver): the page
loads from a running node, shows a job submitted after it loaded, the grid of the node and its
peer, charts drawn from the jobs that ran, and a flow's DAG, across two nodes, with the node of
each job, changing colour as its jobs finish.

Skipped when Chromium is missing, except under CI (``CI`` set), where that is a failure.
``HERO_CONSOLE_SCREENSHOT=PATH`` also saves the screenshot the test takes there (how
docs/console.png is made).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from selenium.common.exceptions import StaleElementReferenceException

from bus.core import keys
from node.config.console import ConsoleConfig
from tests.nodes import link_to

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1440,1400",
]
COLOURS = {"waiting": "#9aa0a6", "dispatched": "#4a90d9", "finished": "#2e9d5b"}
WAIT_S = 30

# Resolves when an element matching the selector exists: checked at once, then on every change
# of the page (a MutationObserver), so the test waits on the page's own events, not a timer.
WAIT_FOR_SELECTOR = """
const selector = arguments[0], done = arguments[arguments.length - 1];
const found = () => document.querySelector(selector);
if (found()) { done(true); return; }
const observer = new MutationObserver(() => {
  if (found()) { observer.disconnect(); done(true); }
});
observer.observe(document.documentElement, {subtree: true, childList: true, attributes: true});
"""

# Resolves when the polyline matching the selector has at least arguments[1] points, checked
# as WAIT_FOR_SELECTOR checks.
WAIT_FOR_POINTS = """
const selector = arguments[0], least = arguments[1], done = arguments[arguments.length - 1];
const found = () => {
  const line = document.querySelector(selector);
  return line && line.getAttribute("points").trim().split(/\\s+/).length >= least;
};
if (found()) { done(true); return; }
const observer = new MutationObserver(() => {
  if (found()) { observer.disconnect(); done(true); }
});
observer.observe(document.documentElement, {subtree: true, childList: true, attributes: true});
"""


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        why = (
            f"the console test needs {CHROMIUM} and {CHROMEDRIVER} "
            "(apt-get install chromium chromium-driver)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager: never fetch a driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "driver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


async def in_browser(fn, *args):  # noqa: ANN001, ANN202 - a WebDriver call
    """A blocking WebDriver call, off the trio thread: the node it talks to runs on it."""
    return await trio.to_thread.run_sync(fn, *args)


async def wait_for(driver, selector: str) -> None:
    await in_browser(driver.execute_async_script, WAIT_FOR_SELECTOR, selector)


def click(driver, selector: str) -> None:  # noqa: ANN001 - a WebDriver
    """Click ``selector`` (blocking: run it with :func:`in_browser`). The live feed may redraw
    the element between finding and clicking it; it is found again then."""
    for _ in range(5):
        try:
            driver.find_element("css selector", selector).click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} was redrawn under every click")


async def points_of(driver, selector: str, least: int) -> list[tuple[float, float]]:
    """The points of the polyline ``selector``, once it has at least ``least``."""
    await in_browser(driver.execute_async_script, WAIT_FOR_POINTS, selector, least)
    text = await in_browser(
        driver.execute_script,
        "return document.querySelector(arguments[0]).getAttribute('points')",
        selector,
    )
    return [tuple(float(v) for v in p.split(",")) for p in text.split()]


async def fill_of(driver, flow_id: int, job: str) -> str:
    rect = f'svg[data-flow="{flow_id}"] g[data-job="{job}"] rect'
    return await in_browser(
        driver.execute_script, f"return document.querySelector('{rect}').getAttribute('fill')"
    )


def diamond(fifo: Path) -> dict:
    """A on alice; B on bob, held until the test writes to ``fifo``; C on alice; D after B, C."""
    hold = f"print(open({fifo.name!r}).read().strip())"  # in the job's cwd, its work dir

    def job(jid: str, node: str, script: str, kind: str = "python", depends=()) -> dict:
        return {
            "id": jid,
            "node": node,
            "context": 1,
            "type": kind,
            "script": script,
            "depends": list(depends),
        }

    return {
        "name": "diamond",
        "jobs": [
            job("A", "self", "print(6)"),
            job("B", "bob", hold, depends=["A"]),
            job("C", "self", "echo $((HERO_DEP_A_STDOUT + 1))", "sh", ["A"]),
            job("D", "self", "print('done')", depends=["B", "C"]),
        ],
    }


async def test_console_in_chromium_shows_the_grid_charts_and_a_live_dag(
    node_factory, browser, tmp_path: Path
):
    # charts at 0.5 s: points within seconds (the default, 5 s, would make the test wait)
    alice = await node_factory("alice", console=ConsoleConfig("127.0.0.1:0", chart_every_s=0.5))
    bob = await node_factory("bob")
    actor = await link_to(alice, bob)
    # in bob's context 1 work dir, the one place of the host its sandboxed job B sees
    work = bob.config.home / "work" / "1"
    work.mkdir(parents=True, exist_ok=True)
    fifo = work / "release-b"
    os.mkfifo(fifo, 0o644)
    driver = browser
    with trio.fail_after(120):
        await in_browser(driver.get, alice.info.console_url + "/")
        await wait_for(driver, "#feed-state.st-live")
        assert "hero-node" in await in_browser(lambda: driver.title)

        message = await alice.client.submit_job(
            actor, 1, to="self", context_id=1, script_type="python", script="print(6*7)"
        )
        row = f'#jobs tr[data-key="{message.job[0].key}"][data-status="finished"]'
        await wait_for(driver, row)
        text = await in_browser(lambda: driver.find_element("css selector", row).text)
        assert "42" in text

        # the grid: alice's own card and bob's, its link up and its breaker closed
        await wait_for(driver, f'#grid .card[data-node="{alice.node_id}"][data-link="self"]')
        bob_card = f'#grid .card[data-node="{bob.node_id}"][data-link="up"]'
        await wait_for(driver, bob_card)
        text = await in_browser(lambda: driver.find_element("css selector", bob_card).text)
        assert "bob" in text
        assert "closed" in text
        assert " ms" in text  # its round trip

        rates = 'svg[data-chart="rates"] polyline[data-series="finished"]'
        finished: list[tuple[float, float]] = []
        for batch in range(4):  # a few jobs, each batch in a later sample, for the charts
            for _ in range(batch + 2):
                sent = await alice.client.submit_job(
                    actor, 1, to="self", context_id=1, script_type="python", script="print(1)"
                )
            await alice.client.wait_results(sent, 30)
            finished = await points_of(driver, rates, max(len(finished) + 1, 2))
        xs = [x for x, _ in finished]
        assert xs == sorted(xs)  # oldest first, left to right
        assert min(y for _, y in finished) < max(y for _, y in finished)  # some jobs/s above 0
        await wait_for(driver, 'svg[data-chart="latency"] [data-series="roundtrip_p50"]')
        await wait_for(driver, 'svg[data-chart="depths"] [data-series]')

        flow_id = await alice.client.submit_flow(actor, 1, diamond(fifo), context_id=1)
        dag = f'svg[data-flow="{flow_id}"]'
        await wait_for(driver, f'{dag} g[data-job="C"][data-status="finished"]')
        # the origin knows a remote job as dispatched until its signed result comes back
        await wait_for(driver, f'{dag} g[data-job="B"][data-status="dispatched"]')
        assert await fill_of(driver, flow_id, "A") == COLOURS["finished"]
        assert await fill_of(driver, flow_id, "B") == COLOURS["dispatched"]
        assert await fill_of(driver, flow_id, "D") == COLOURS["waiting"]
        for job, node in {"A": "alice", "B": "bob", "C": "alice", "D": "alice"}.items():
            await wait_for(driver, f'{dag} g[data-job="{job}"][data-node="{node}"]')
        shot = tmp_path / "console.png"
        assert await in_browser(driver.save_screenshot, str(shot))

        await trio.to_thread.run_sync(fifo.write_text, "released\n")
        await wait_for(driver, f'{dag} g[data-job="D"][data-status="finished"]')
        for job in "ABCD":
            assert await fill_of(driver, flow_id, job) == COLOURS["finished"]
        await wait_for(driver, f'div.flow[data-flow="{flow_id}"] .st-finished')
    assert shot.read_bytes().startswith(b"\x89PNG")
    if target := os.environ.get("HERO_CONSOLE_SCREENSHOT"):
        shutil.copyfile(shot, target)


async def test_console_in_chromium_purges_a_dead_letter_with_the_token(node_factory, browser):
    token = "operator-token-for-the-browser-test"
    node = await node_factory("a", console=ConsoleConfig("127.0.0.1:0", token=token))
    await node.store.dead_letter(1, "message:1:77", "malformed", "a test entry", queue="msg_out")
    driver = browser
    purge = '#contexts tr[data-dlq="message:1:77"] button[data-act="purge"]'

    def give_token_and_purge(value: str) -> None:
        field = driver.find_element("css selector", "#token")
        field.clear()
        field.send_keys(value)
        click(driver, purge)

    with trio.fail_after(60):
        await in_browser(driver.get, node.info.console_url + "/")
        await wait_for(driver, purge)
        await in_browser(give_token_and_purge, token + "-wrong")
        await wait_for(driver, '#action-result[data-outcome="refused"]')
        assert await node.store.llen(1, keys.DLQ) == 1
        await in_browser(give_token_and_purge, token)
        await wait_for(driver, '#action-result[data-outcome="done"]')
        await wait_for(driver, '#contexts div[data-context="1"][data-dlq-length="0"]')
    assert await node.store.llen(1, keys.DLQ) == 0
    page = await in_browser(lambda: driver.page_source)
    assert token not in page
