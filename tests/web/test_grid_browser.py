"""The console's grid view in a real headless Chromium, over three real nodes: each node's card
with the figures its peer told over the link, the charts per node and for the grid, a flow
across the three nodes with each job's node, and one job's hop timeline (its attempts where
it ran, told by that node).

Skipped when Chromium is missing, except under CI, as test_console_browser.py is.
"""

from __future__ import annotations

import trio

from node.config.console import ConsoleConfig
from tests.flows.test_flows import job, mesh
from tests.web.test_console_browser import (  # noqa: F401 - browser: a fixture
    browser,
    click,
    in_browser,
    wait_for,
)

# fails its first attempt (exit 3), leaving a marker in its work dir; the retry finds it
FAIL_ONCE = (
    "import os, sys\n"
    "if not os.path.exists('tried'):\n"
    "    open('tried', 'w').close()\n"
    "    sys.exit(3)\n"
    "print('ok')\n"
)


async def attr(driver, selector: str, name: str) -> str:  # noqa: ANN001 - a WebDriver
    script = "return document.querySelector(arguments[0]).getAttribute(arguments[1])"
    return await in_browser(driver.execute_script, script, selector, name)


async def test_the_grid_shows_three_nodes_a_flow_across_them_and_a_timeline(
    node_factory,
    browser,  # noqa: F811 - the fixture
):
    console = ConsoleConfig("127.0.0.1:0", chart_every_s=0.5)
    alice = await node_factory("alice", console=console)
    bob = await node_factory("bob", console=ConsoleConfig("127.0.0.1:0", chart_every_s=0.5))
    carol = await node_factory("carol")  # no console: it tells its figures, no charts
    actor = await mesh(alice, bob, carol)
    spec = {
        "name": "diamond",
        "jobs": [
            job("A", "self", "print(6)"),
            job("B", "bob", FAIL_ONCE, depends=["A"], retries=1),
            job("C", "carol", "echo c", kind="sh", depends=["A"]),
            job("D", "alice", "print('d')", depends=["B", "C"]),
        ],
    }
    driver = browser
    with trio.fail_after(120):
        flow_id = await alice.client.submit_flow(actor, 1, spec, context_id=1)
        await alice.client.wait_flow(flow_id, 1, timeout_s=60)
        await in_browser(driver.get, alice.info.console_url + "/")
        await wait_for(driver, "#feed-state.st-live")

        # three cards, the peers' with the figures they told (3 runners each: python 2, sh 1)
        await wait_for(driver, f'#grid .card[data-node="{alice.node_id}"][data-link="self"]')
        for peer in (bob, carol):
            card = f'#grid .card[data-node="{peer.node_id}"][data-link="up"][data-told="yes"]'
            await wait_for(driver, card)
            assert await attr(driver, f'{card} [data-fig="runners"]', "data-value") == "3"
            assert await attr(driver, f'{card} [data-fig="queued"]', "data-value") == "0"

        # charts per node (alice's and bob's: carol samples nothing) and for the grid
        for chart in ("grid-rates", "grid-latency", "grid-depths"):
            await wait_for(driver, f'svg[data-chart="{chart}"] [data-series="grid"]')
        for node in (alice, bob):
            line = f'[data-series="node-{node.node_id[:16]}"]'
            await wait_for(driver, f'svg[data-chart="grid-rates"] {line}')

        # the flow with each job's node
        dag = f'svg[data-flow="{flow_id}"]'
        for jid, node in {"A": "alice", "B": "bob", "C": "carol", "D": "alice"}.items():
            done = f'g[data-job="{jid}"][data-node="{node}"][data-status="finished"]'
            await wait_for(driver, f"{dag} {done}")

        # B's timeline, from a click on it: two attempts on bob, the first failed
        key = await attr(driver, f'{dag} g[data-job="B"]', "data-key")
        b_box = f'{dag} g[data-job="B"] rect'
        await in_browser(click, driver, b_box)
        job_row = f'#timeline[data-state="drawn"] .timeline-job[data-key="{key}"]'
        await wait_for(driver, job_row)
        assert await attr(driver, job_row, "data-node") == bob.node_id
        assert await attr(driver, job_row, "data-attempts") == "2"
        first = f'{job_row} g[data-what="attempt"][data-attempt="1"]'
        assert await attr(driver, first, "data-outcome") == "error"
        assert await attr(driver, first, "data-node") == bob.node_id
        second = f'{job_row} g[data-what="attempt"][data-attempt="2"]'
        assert await attr(driver, second, "data-outcome") == "finished"

        # the whole flow's timeline, from its title: every job on its node
        await in_browser(click, driver, f'h3[data-trace="flow:{flow_id}"]')
        await wait_for(driver, f'#timeline[data-state="drawn"][data-key="flow:{flow_id}"]')
        for node in (alice, bob, carol):
            await wait_for(driver, f'#timeline .timeline-job[data-node="{node.node_id}"]')
        text = await in_browser(lambda: driver.find_element("css selector", "#timeline").text)
    assert "print(" not in text  # a timeline never holds a script
