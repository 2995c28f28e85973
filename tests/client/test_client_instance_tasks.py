"""Tasks under MQClientInstance's TaskGroup: ``spawn`` guards a coroutine, ``spawn_self_guarded`` runs
one that guards itself (each pull's answer) as it is; neither runs anything after shutdown."""

from __future__ import annotations

import asyncio
import gc
import warnings

from rmqlab.client.client_config import ClientConfig
from rmqlab.client.instance import MQClientInstance, MQClientManager


async def test_self_guarded_tasks_run_under_the_instance_and_end_with_it() -> None:
    instance = MQClientInstance(ClientConfig(namesrv_addr="127.0.0.1:1"), client_id="t@1")
    ran: list[str] = []
    release = asyncio.Event()

    async def answer(name: str) -> None:
        ran.append(name)
        await release.wait()
        ran.append(f"{name} done")

    await instance.start()
    first = instance.spawn_self_guarded(answer("first"))
    assert first is not None
    await asyncio.sleep(0)
    assert ran == ["first"]
    release.set()
    await first
    assert ran == ["first", "first done"]

    release.clear()
    held = instance.spawn_self_guarded(answer("held"))
    unstarted = instance.spawn_self_guarded(answer("never started"))  # cancelled before its first step
    assert held is not None and unstarted is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unstarted.cancel()
        await asyncio.sleep(0)
        await instance.shutdown()
        late = answer("late")
        assert instance.spawn_self_guarded(late) is None
        del late
        gc.collect()
    assert held.cancelled() and unstarted.cancelled()
    assert ran == ["first", "first done", "held"]
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_process_of_its_own_has_its_own_client_table() -> None:
    # the simulator's processes share one OS process; two of them may carry one client id
    config = ClientConfig()
    shared = MQClientManager.get_or_create(config, "10.0.0.9@1")

    async def process() -> MQClientInstance:
        MQClientManager.own_process()
        inst = MQClientManager.get_or_create(config, "10.0.0.9@1")
        assert MQClientManager.get_or_create(config, "10.0.0.9@1") is inst
        return inst

    a, b = await asyncio.gather(process(), process())
    assert len({id(a), id(b), id(shared)}) == 3
    assert MQClientManager.get_or_create(config, "10.0.0.9@1") is shared
    MQClientManager.remove("10.0.0.9@1")
