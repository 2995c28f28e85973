"""``rmq-admin``: talk to a broker's admin codes (fault injection 9000-9002, policies 9003, status 9004)
and create topics (UPDATE_AND_CREATE_TOPIC). ``AdminClient`` (``lab.admin_client``) is the same thing for
programs.

Exit codes: 0 done, 1 the broker answered with an error, 2 bad usage, 3 the broker could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from rmqlab.cli import add_access_keys, command_parser, host_port, non_negative_int, positive_int
from rmqlab.client.client_config import PROTOCOLS
from rmqlab.lab.admin_client import PERM_READ_WRITE, AdminClient, AdminError
from rmqlab.protocol.acl_signing import SessionCredentials
from rmqlab.protocol.codes import RequestCode
from rmqlab.protocol.remoting import RemotingError


def parse_error(text: str) -> dict[str, Any]:
    """``CODE`` or ``CODE:REMARK`` -> ``{"code": CODE, "remark": REMARK}`` (argparse type)."""
    code, sep, remark = text.partition(":")
    try:
        num = int(code.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CODE or CODE:REMARK with an integer CODE, got {text!r}"
        ) from None
    if num < 0:
        raise argparse.ArgumentTypeError(f"the response code must be >= 0, got {num}")
    return {"code": num, "remark": remark if sep else "injected fault"}


def parse_request_code(text: str) -> int:
    """A request code as a number (``11``) or a name (``PULL_MESSAGE``)."""
    try:
        value = int(text)
    except ValueError:
        try:
            return int(RequestCode[text.strip().upper()])
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"unknown request code {text!r} (a number or e.g. PULL_MESSAGE)"
            ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"request code must be >= 0, got {value}")
    return value


def _on_off(text: str) -> bool:
    v = text.strip().lower()
    if v in ("on", "true", "yes", "1"):
        return True
    if v in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "rmq-admin",
        "Admin requests to a broker: fault injection, what-if policies, status, topics.",
        {
            0: "done",
            1: "the broker answered with an error",
            2: "bad usage",
            3: "the broker could not be reached",
            130: "interrupted",
        },
    )
    p.add_argument(
        "--broker", required=True, type=host_port, metavar="HOST:PORT", help="the broker to talk to"
    )
    p.add_argument("--timeout", type=float, default=5.0, metavar="S", help="request timeout in seconds (5)")
    p.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="msgpack",
        help="msgpack (the lab's brokers, the default) or native (RocketMQ's own protocol: Apache's broker "
        "or our brokers' native ports; Apache's broker answers the lab's own codes (fault, policy, status) "
        "REQUEST_CODE_NOT_SUPPORTED)",
    )
    add_access_keys(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fault = sub.add_parser("fault", help="inject, list and clear request-level faults")
    fsub = fault.add_subparsers(dest="fault_command", required=True, metavar="add|clear|list")
    add = fsub.add_parser(
        "add",
        help="answer matching requests with errors, delay them or drop their responses",
        description="Matches requests by --code (and --group / --client-id when given). Applies to --count "
        "requests, or for --duration-ms, or (errors only) to as many requests as errors were given.",
    )
    add.add_argument(
        "--code", required=True, type=parse_request_code, help="request code, e.g. 11 or PULL_MESSAGE"
    )
    add.add_argument(
        "--error",
        action="append",
        type=parse_error,
        default=[],
        metavar="CODE[:REMARK]",
        help='an error response, answered in turn (repeatable), e.g. 1:"boom"',
    )
    add.add_argument(
        "--count", type=positive_int, default=None, help="how many matching requests it applies to"
    )
    add.add_argument("--group", default=None, help="only requests of this consumer group")
    add.add_argument("--client-id", default=None, help="only requests of this client id")
    add.add_argument("--latency-ms", type=non_negative_int, default=0, help="delay before answering (ms)")
    add.add_argument("--drop", action="store_true", help="send no response at all")
    add.add_argument("--duration-ms", type=positive_int, default=None, help="how long the fault lasts (ms)")
    clear = fsub.add_parser("clear", help="remove one fault (--id) or all")
    clear.add_argument("--id", type=positive_int, default=None, dest="fault_id")
    fsub.add_parser("list", help="the broker's active faults as JSON")

    pol = sub.add_parser("policy", help="switch the what-if policies (off = RocketMQ's behaviour)")
    pol.add_argument("--notify-on-channel-expired", type=_on_off, default=None, metavar="on|off")
    pol.add_argument("--release-locks-on-close", type=_on_off, default=None, metavar="on|off")

    sub.add_parser("status", help="the broker's counts (topics, messages, groups, connections) as JSON")

    topic = sub.add_parser("topic", help="topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="create")
    create = tsub.add_parser("create", help="create or update a topic on this broker")
    create.add_argument("--topic", required=True)
    create.add_argument("--queues", required=True, type=positive_int, help="read and write queue count")
    create.add_argument("--perm", type=int, default=PERM_READ_WRITE, choices=(2, 4, 6), help="6 = read+write")

    group = sub.add_parser("group", help="consumer groups (RocketMQ 5 server-side assignment)")
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="request-mode")
    mode = gsub.add_parser(
        "request-mode",
        help="set a group's request mode for a topic (SET_MESSAGE_REQUEST_MODE), kept by the broker",
    )
    mode.add_argument("--group", required=True)
    mode.add_argument("--topic", required=True)
    mode.add_argument("--mode", required=True, choices=("PULL", "POP"))
    mode.add_argument(
        "--pop-share-queue-num",
        type=int,
        default=0,
        metavar="N",
        help="POP: <= 0 or >= members - 1: every consumer pops every queue; else each pops its own queues "
        "and those of the next N members (default 0)",
    )
    return p


async def _run(args: argparse.Namespace) -> int:
    credentials = SessionCredentials.resolve(args.access_key, args.secret_key)
    native = args.protocol == "native"
    async with AdminClient(timeout_s=args.timeout, credentials=credentials, native=native) as admin:
        b = args.broker
        if args.command == "fault":
            if args.fault_command == "add":
                fid = await admin.fault_add(
                    b,
                    request_code=args.code,
                    errors=args.error,
                    count=args.count,
                    group=args.group,
                    client_id=args.client_id,
                    latency_ms=args.latency_ms,
                    drop=args.drop,
                    duration_ms=args.duration_ms,
                )
                print(f"fault {fid} added")
            elif args.fault_command == "clear":
                await admin.fault_clear(b, args.fault_id)
                print("cleared " + (f"fault {args.fault_id}" if args.fault_id else "all faults"))
            else:
                print(json.dumps(await admin.fault_list(b), indent=2, sort_keys=True))
        elif args.command == "policy":
            await admin.policy_set(
                b,
                notify_on_channel_expired=args.notify_on_channel_expired,
                release_locks_on_close=args.release_locks_on_close,
            )
            print("policy updated")
        elif args.command == "status":
            print(json.dumps(await admin.status(b), indent=2, sort_keys=True, default=str))
        elif args.command == "topic":
            await admin.topic_create(b, args.topic, args.queues, args.perm)
            print(f"topic {args.topic} created with {args.queues} queues")
        elif args.command == "group":
            await admin.set_message_request_mode(
                b, args.topic, args.group, args.mode, args.pop_share_queue_num
            )
            print(f"group {args.group} reads {args.topic} in {args.mode} mode")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (
        args.command == "fault"
        and args.fault_command == "add"
        and not (args.error or args.latency_ms or args.drop)
    ):
        parser.error("fault add needs at least one of --error, --latency-ms or --drop")
    if (
        args.command == "policy"
        and args.notify_on_channel_expired is None
        and args.release_locks_on_close is None
    ):
        parser.error("policy needs --notify-on-channel-expired and/or --release-locks-on-close")
    try:
        credentials = SessionCredentials.resolve(args.access_key, args.secret_key)
    except ValueError as exc:
        parser.error(str(exc))
    if credentials is not None and args.protocol == "native":
        parser.error("--protocol native does not sign requests: access keys need msgpack")
    try:
        return asyncio.run(_run(args))
    except AdminError as e:
        print(f"rmq-admin: {e}", file=sys.stderr)
        return 1
    except (RemotingError, OSError) as e:
        print(f"rmq-admin: cannot reach broker {args.broker}: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
