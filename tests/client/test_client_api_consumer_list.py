"""GET_CONSUMER_LIST_BY_GROUP as the client reads it, over a real socket: the ids that are strings, and an
answer equal to one checked before taken without checking each type again."""

from __future__ import annotations

from typing import Any

from rmqlab.client.api import MQClientAPI
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import Connection, RemotingClient, RemotingServer


async def test_consumer_list_keeps_only_strings_even_after_an_equal_looking_answer() -> None:
    answers: list[list[Any]] = [
        ["a@1", "b@2"],
        ["b@2", "a@1"],  # another broker's order
        ["a@1", "b@2"],  # equal to one checked before
        ["a@1", 2],  # same length, one id not a string: checked again, not taken as the one before
        [b"a@1", "b@2"],
        ["a@1", "b@2", "c@3"],
    ]
    groups: list[str] = []

    def consumer_list(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        groups.append(cmd.ext_str("consumerGroup"))
        return cmd.response(body={"consumerIdList": answers.pop(0)})

    server = RemotingServer()
    server.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, consumer_list)
    await server.start()
    client = RemotingClient()
    api = MQClientAPI(client)
    try:
        got = [await api.get_consumer_id_list(server.address, "g", 2.0) for _ in range(6)]
    finally:
        await client.close()
        await server.close()
    assert got == [["a@1", "b@2"], ["b@2", "a@1"], ["a@1", "b@2"], ["a@1"], ["b@2"], ["a@1", "b@2", "c@3"]]
    assert groups == ["g"] * 6
