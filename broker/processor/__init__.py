"""Request processors of the broker, named after RocketMQ's: each maps request codes to handlers."""

from __future__ import annotations

from rmqlab.broker.processor.admin_broker import AdminBrokerProcessor
from rmqlab.broker.processor.assignment import QueryAssignmentProcessor
from rmqlab.broker.processor.client_manage import ClientManageProcessor
from rmqlab.broker.processor.consumer_manage import ConsumerManageProcessor
from rmqlab.broker.processor.ha_requests import HAProcessor
from rmqlab.broker.processor.pop_requests import PopMessageProcessor
from rmqlab.broker.processor.pull import PullMessageProcessor
from rmqlab.broker.processor.send import SendMessageProcessor
from rmqlab.broker.processor.services import BrokerServices
from rmqlab.protocol.codes import RequestCode


def register_processors(broker: BrokerServices, pop: PopMessageProcessor | None = None) -> None:
    """Register every processor; ``pop`` is the broker's own POP processor (it also runs the revive)."""
    server = broker.server
    for proc in (
        ClientManageProcessor(broker),
        ConsumerManageProcessor(broker),
        SendMessageProcessor(broker),
        PullMessageProcessor(broker),
        AdminBrokerProcessor(broker),
        QueryAssignmentProcessor(broker),
        HAProcessor(broker),
        pop or PopMessageProcessor(broker),
    ):
        for code, handler in proc.handlers().items():
            server.register(code, broker.wrap(code, handler))
    # Unknown codes go through the same wrapper so that their answer also waits for earlier writes.
    server.set_default_handler(broker.wrap(-1, broker.unsupported))


__all__ = ["RequestCode", "register_processors"]
