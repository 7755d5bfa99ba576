"""A watch's wait for its next event stays cancellable: the triggerer cancels a trigger whose task is done, and a
watch whose queue is busy (pod and bookmark events) must still end. ``asyncio.wait_for`` on Python 3.11 swallows a
cancellation that arrives in the same loop iteration as the item (CPython gh-86296); this is the case that lost the
cancellation of a busy watch, made deterministic."""

from __future__ import annotations

import asyncio

from kvfleet.airflow.triggers.kube_watch import next_or_none


async def _watch_loop(queue: asyncio.Queue[int], seen: list[int | None]) -> None:
    while True:  # as KubeWatchTrigger.run: an item or None after the quiet period, forever
        seen.append(await next_or_none(queue, 0.5))


async def _cancel_as_an_item_arrives() -> tuple[str, list[int | None]]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    seen: list[int | None] = []
    task = asyncio.create_task(_watch_loop(queue, seen))
    for _ in range(3):  # the loop is now waiting on the queue
        await asyncio.sleep(0)
    queue.put_nowait(1)  # the item and the cancellation in the same iteration
    task.cancel()
    try:
        await asyncio.wait_for(asyncio.shield(task), 2.0)
    except asyncio.CancelledError:
        return "cancelled", seen
    except TimeoutError:
        task.cancel()
        return "still running", seen
    return "returned", seen


def test_a_watch_waiting_for_its_next_event_ends_when_cancelled_even_as_an_event_arrives() -> None:
    outcome, seen = asyncio.run(_cancel_as_an_item_arrives())
    assert outcome == "cancelled", (outcome, seen)


def test_the_next_event_or_none_after_the_quiet_period() -> None:
    async def scenario() -> tuple[int | None, int | None]:
        queue: asyncio.Queue[int] = asyncio.Queue()
        queue.put_nowait(7)
        return await next_or_none(queue, 0.5), await next_or_none(queue, 0.01)

    assert asyncio.run(scenario()) == (7, None)
