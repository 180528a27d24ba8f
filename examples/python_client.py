"""A complete hero-bus client: jobs, results, errors and a flow, on one node.

Run it against a running node (docs/use/client.md)::

    python examples/python_client.py "$(hero-node credentials client)" ~/.hero-node/actor.key

It signs with the actor key (actor 1, an admin of context 1 on a fresh home) and prints what
happened, one line per step.
"""

from __future__ import annotations

import sys

import trio

from bus import (
    Client,
    ClientError,
    FlowError,
    FlowState,
    JobResult,
    JobStatus,
    new_job,
    open_client,
)
from crypto import KeyPair, read_key_file

ACTOR_ID = 1
CONTEXT_ID = 1


def show(result: JobResult) -> str:
    """One line for a job's result: its output, or why it failed."""
    if result.ok:
        return f"finished: {result.stdout.strip()}"
    code = result.result.get("exit_code", "-")
    return f"{result.status.value}: {result.reason} (exit code {code})"


def step(name: str, script_type: str, script: str, *after: str) -> dict[str, object]:
    """A job of a flow document, on this node, run once the jobs ``after`` have finished."""
    return {"id": name, "node": "self", "context": CONTEXT_ID, "type": script_type,
            "script": script, "depends": list(after)}  # fmt: skip


async def jobs(client: Client, actor: KeyPair) -> None:
    # One message may carry several jobs; each gets its own result, in the order they end.
    square = new_job(ACTOR_ID, CONTEXT_ID, "python", "print(7 * 6)")
    shell = new_job(ACTOR_ID, CONTEXT_ID, "sh", "echo hello from sh")
    message = await client.submit(
        actor, ACTOR_ID, to="self", context_id=CONTEXT_ID, jobs=[square, shell]
    )
    results = {r.job_key: r for r in await client.wait_results(message, timeout_s=60)}
    print("python job", show(results[square.key]))
    print("sh job", show(results[shell.key]))

    # A failing script is no exception: its result says error, with the reason and stderr.
    failing = await client.submit_job(
        actor,
        ACTOR_ID,
        to="self",
        context_id=CONTEXT_ID,
        script_type="python",
        script="import sys; sys.exit('no input')",
        retries=1,
    )
    [result] = await client.wait_results(failing, timeout_s=60)
    assert result.status is JobStatus.ERROR
    attempts, stderr = result.result["attempts"], result.result["stderr"].strip()
    print("failing job", show(result), f"after {attempts} attempts, stderr: {stderr}")


async def flow(client: Client, actor: KeyPair) -> None:
    # A DAG: B and C need A's output (HERO_DEP_A_STDOUT), D joins them.
    doc = {
        "name": "diamond",
        "jobs": [
            step("A", "python", "print(6)"),
            step("B", "python", "import os; print(int(os.environ['HERO_DEP_A_STDOUT']) * 7)", "A"),
            step("C", "sh", "echo $((HERO_DEP_A_STDOUT + 1))", "A"),
            step("D", "sh", 'echo "$HERO_DEP_B_STDOUT and $HERO_DEP_C_STDOUT"', "B", "C"),
        ],
    }
    flow_id = await client.submit_flow(actor, ACTOR_ID, doc, context_id=CONTEXT_ID)

    def progress(state: FlowState) -> None:
        done = sum(job.status.final for job in state.jobs)
        print(f"flow {state.status.value}: {done}/{len(state.jobs)} jobs over")

    state = await client.wait_flow(flow_id, CONTEXT_ID, timeout_s=120, on_change=progress)
    print("flow", state.status.value, "D says:", state.job("D").stdout.strip())


async def mistakes(client: Client, actor: KeyPair) -> None:
    # Mistakes the client catches before anything is sent raise ClientError / FlowError.
    try:
        await client.submit_job(
            actor, ACTOR_ID, to="nowhere", context_id=CONTEXT_ID, script_type="sh", script="true"
        )
    except ClientError as exc:
        print("refused:", exc)

    cycle = {"jobs": [step("X", "sh", "true", "Y"), step("Y", "sh", "true", "X")]}
    try:
        await client.submit_flow(actor, ACTOR_ID, cycle, context_id=CONTEXT_ID)
    except FlowError as exc:
        print("flow refused:", ", ".join(exc.jobs))
    # Waiting is bounded: a job that takes longer than timeout_s raises ClientError; its result
    # still comes later, for whoever waits again.
    slow = await client.submit_job(
        actor, ACTOR_ID, to="self", context_id=CONTEXT_ID, script_type="sh", script="sleep 2"
    )
    try:
        await client.wait_results(slow, timeout_s=0.5)
    except ClientError as exc:
        print("still running:", exc)
    [result] = await client.wait_results(slow, timeout_s=60)
    print("slow job", result.status.value)


async def main(redis_url: str, actor_key: str) -> None:
    actor = read_key_file(actor_key)
    async with open_client(redis_url) as client:
        print("node", (await client.node_id())[:16])
        await jobs(client, actor)
        await flow(client, actor)
        await mistakes(client, actor)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python_client.py REDIS_URL ACTOR_KEY_FILE")
    trio.run(main, sys.argv[1], sys.argv[2])
