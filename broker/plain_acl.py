"""RocketMQ 4.9's plain ACL on the broker (PlainAccessValidator, PlainPermissionManager, Permission).

``--acl FILE`` reads a ``plain_acl.yml``: a global address whitelist and accounts with accessKey /
secretKey, an optional whiteRemoteAddress, an admin flag, default topic and group permissions and
per-topic / per-group ones. Every request on both ports is then checked as RocketMQ checks it:
a whitelisted address passes; otherwise the request must name a known accessKey, carry its valid
signature (``protocol.acl_signing``) and hold the permission its resources need; admin-only codes need an
admin account. A refusal is NO_PERMISSION with RocketMQ's message as the remark.

RocketMQ 4.9 has no POP codes; for them the resources are RocketMQ 5's (``develop``: the
``@RocketMQAction``/``@RocketMQResource`` annotations of the request headers that its authorization
context builder reads), mapped onto the plain accounts: POP_MESSAGE, ACK_MESSAGE and
CHANGE_MESSAGE_INVISIBLETIME need SUB on the group and on the topic; the body-only codes need a signature.

The file is read with a small YAML reader that accepts plain_acl.yml's shape only (README "ACL"):
``key: value`` maps, ``- item`` lists, comments, plain or quoted scalars. Anything else is an error
``file:line: problem``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmqlab.protocol.acl_signing import SignedContent, cal_signature, msgpack_signed_content
from rmqlab.protocol.codes import ADMIN_CODE_RANGE, RequestCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.model import is_retry_topic, retry_topic

# Permission bits (org.apache.rocketmq.acl.common.Permission).
DENY = 1
ANY = 1 << 1
PUB = 1 << 2
SUB = 1 << 3

# Codes that need an admin account: RocketMQ's ADMIN_CODE that the emulator serves (topic creation and
# update), plus broker registration and the project's own admin and fault codes.
ADMIN_CODES: frozenset[int] = frozenset(
    {
        int(RequestCode.UPDATE_AND_CREATE_TOPIC),
        int(RequestCode.REGISTER_BROKER),
        int(RequestCode.UNREGISTER_BROKER),
    }
    | set(ADMIN_CODE_RANGE)
)

# The POP codes whose request header names a group and a topic. RocketMQ 5 registers no header for
# BATCH_ACK_MESSAGE, QUERY_ASSIGNMENT and SET_MESSAGE_REQUEST_MODE (their fields are in the body), so
# those are checked for a valid signature only.
POP_HEADER_CODES: frozenset[int] = frozenset(
    {
        int(RequestCode.POP_MESSAGE),
        int(RequestCode.ACK_MESSAGE),
        int(RequestCode.CHANGE_MESSAGE_INVISIBLETIME),
    }
)

ACCESS_KEY_MIN_LENGTH = 6  # AclConstants: keys must be longer than this
SECRET_KEY_MIN_LENGTH = 6


class AclConfigError(ValueError):
    """plain_acl.yml is malformed; the message is ``file:line: problem``."""


def parse_perm(text: str | None) -> int:
    """Permission.parsePermFromString: anything unknown is DENY."""
    if text is None:
        return DENY
    return {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}.get(
        text.strip(), DENY
    )


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & PUB or owned & SUB)
    return bool(needed & owned)


# -- remote address strategies (RemoteAddressStrategyFactory) ---------------------------------------------


def address_matcher(pattern: str | None) -> Callable[[str], bool]:
    """A whiteRemoteAddress pattern as a predicate on a client's IP: blank matches nothing, ``*``
    everything; ``a,b,c`` any of them; ``1.2.3.{4,5}`` either; ``1.2.*.*`` and ``1.2.3.10-20`` ranges
    per IPv4 part; anything else one exact address."""
    p = (pattern or "").strip()
    if not p:
        return lambda ip: False
    if p in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return lambda ip: True
    if p.endswith("}"):
        head, brace, tail = p.rpartition("{")
        if not brace or "." not in head:
            raise ValueError(f"bad address set {p!r}")
        choices = {head + part.strip() for part in tail[:-1].split(",")}
        return lambda ip: ip in choices
    if "," in p:
        choices = {part.strip() for part in p.split(",")}
        return lambda ip: ip in choices
    if "*" in p or "-" in p:
        parts = p.split(".")
        if len(parts) != 4:
            raise ValueError(f"bad address range {p!r} (IPv4 a.b.c.d with * or low-high parts)")
        ranges = [_octet_range(part, p) for part in parts]

        def in_range(ip: str) -> bool:
            got = ip.split(".")
            if len(got) != 4 or not all(g.isdigit() for g in got):
                return False
            return all(lo <= int(g) <= hi for g, (lo, hi) in zip(got, ranges, strict=True))

        return in_range
    return lambda ip: ip == p


def _octet_range(part: str, pattern: str) -> tuple[int, int]:
    if part == "*":
        return 0, 255
    lo, dash, hi = part.partition("-")
    try:
        low, high = (int(lo), int(hi)) if dash else (int(part), int(part))
    except ValueError:
        raise ValueError(f"bad address range {pattern!r}") from None
    if not 0 <= low <= high <= 255:
        raise ValueError(f"bad address range {pattern!r}")
    return low, high


def client_ip(remote_addr: str) -> str:
    """``host:port`` or ``[v6]:port`` -> host, as PlainAccessValidator cuts the remote address."""
    host = remote_addr.rpartition(":")[0] if ":" in remote_addr else remote_addr
    return host.strip("[]")


def is_loopback(remote_addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(client_ip(remote_addr))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


# -- accounts -----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class PlainAccount:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    resource_perms: dict[str, int] = field(default_factory=dict)  # topic or %RETRY%group -> perm
    white_remote_address: Callable[[str], bool] = field(default=lambda ip: False)


@dataclass(slots=True)
class AclConfig:
    accounts: dict[str, PlainAccount]
    global_white: list[Callable[[str], bool]]


class AclDenied(Exception):
    """The request is refused; the message is RocketMQ's AclException text."""


class PlainAccessValidator:
    def __init__(self, config: AclConfig) -> None:
        self.config = config

    @classmethod
    def from_file(cls, path: str) -> PlainAccessValidator:
        with open(path, encoding="utf-8") as f:
            return cls(load_acl_config(f.read(), path))

    def validate(self, remote_addr: str, cmd: RemotingCommand) -> None:
        """PlainPermissionManager.validate over PlainAccessValidator.parse; raises AclDenied."""
        ip = client_ip(remote_addr)
        if any(match(ip) for match in self.config.global_white):
            return
        signed = (
            cmd.auth if isinstance(cmd.auth, SignedContent) else msgpack_signed_content(cmd.ext, cmd.body)
        )
        if signed is None or signed.access_key is None:
            raise AclDenied("No accessKey is configured")
        account = self.config.accounts.get(signed.access_key)
        if account is None:
            raise AclDenied(f"No acl config for {signed.access_key}")
        if account.white_remote_address(ip):
            return
        if cal_signature(signed.content, account.secret_key) != signed.signature:
            raise AclDenied(f"Check signature failed for accessKey={signed.access_key}")
        self._check_perm(cmd, account)

    def _check_perm(self, cmd: RemotingCommand, account: PlainAccount) -> None:
        if cmd.code in ADMIN_CODES and not account.admin:
            raise AclDenied(
                f"Need admin permission for request code={cmd.code}, "
                f"but accessKey={account.access_key} is not"
            )
        needed = needed_resources(cmd)
        if not needed or (account.admin and not account.resource_perms):
            return
        for resource, perm in needed.items():
            is_group = is_retry_topic(resource)
            owned = account.resource_perms.get(resource)
            if owned is None:
                owned = account.default_group_perm if is_group else account.default_topic_perm
            if not check_permission(perm, owned):
                # PlainAccessResource.printStr
                what = f"group:{resource.removeprefix('%RETRY%')}" if is_group else f"topic:{resource}"
                raise AclDenied(f"No default permission for {what}")


def _s(value: Any) -> str:
    """A header value as Java would have it in extFields (a missing one prints as null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def needed_resources(cmd: RemotingCommand) -> dict[str, int]:
    """PlainAccessValidator.parse's resource -> permission map for the codes it checks."""
    ext = cmd.ext
    code = cmd.code
    need: dict[str, int] = {}

    def add(resource: str, perm: int) -> None:
        need[resource] = perm  # addResourceAndPerm keeps the last

    if code == RequestCode.SEND_MESSAGE:  # SEND_MESSAGE_V2 arrives translated to SEND_MESSAGE
        topic = _s(ext.get("topic"))
        if is_retry_topic(topic):
            add(retry_topic(_s(ext.get("group"))), SUB)  # RocketMQ reads "group", which a send lacks
        else:
            add(topic, PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        add(retry_topic(_s(ext.get("group"))), SUB)
    elif code == RequestCode.PULL_MESSAGE:
        add(_s(ext.get("topic")), SUB)
        add(retry_topic(_s(ext.get("consumerGroup"))), SUB)
    elif code == RequestCode.HEART_BEAT:
        body = cmd.body if isinstance(cmd.body, dict) else {}
        for cd in body.get("consumerDataSet") or []:
            if not isinstance(cd, dict):
                continue
            add(retry_topic(_s(cd.get("groupName"))), SUB)
            for sd in cd.get("subscriptionDataSet") or []:
                if isinstance(sd, dict):
                    add(_s(sd.get("topic")), SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        add(retry_topic(_s(ext.get("consumerGroup"))), SUB)
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        add(retry_topic(_s(ext.get("consumerGroup"))), SUB)
        add(_s(ext.get("topic")), SUB)
    elif code in POP_HEADER_CODES:
        # RocketMQ 5 names these resources on the request header (@RocketMQResource on consumerGroup and
        # topic, action SUB) and skips a field the request leaves out. A %RETRY% topic (the pop retry topic
        # of a revived message, %RETRY%<group>_<topic>) stands for a group, which this table keys by its
        # retry topic already.
        group, topic = ext.get("consumerGroup"), ext.get("topic")
        if group is not None:
            add(retry_topic(_s(group)), SUB)
        if topic is not None:
            add(_s(topic), SUB)
    return need


# -- plain_acl.yml ------------------------------------------------------------------------------------------

_KEY_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):(?:\s+(.*))?$")


def _scalar(text: str, where: str) -> str | None:
    t = text.strip()
    if t in ("", "~", "null"):
        return None
    if t[0] in "'\"":
        if len(t) < 2 or t[-1] != t[0]:
            raise AclConfigError(f"{where}: unterminated quoted value {t!r}")
        return t[1:-1].replace("''", "'") if t[0] == "'" else t[1:-1]
    if t[0] in "[{&*!|>":
        raise AclConfigError(f"{where}: {t[0]!r} values are not supported (plain_acl.yml needs none)")
    return t


def _strip_comment(line: str) -> str:
    out = []
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def parse_plain_acl_yaml(text: str, path: str = "plain_acl.yml") -> dict[str, Any]:
    """The YAML subset of plain_acl.yml as plain dicts, lists and strings."""
    lines: list[tuple[int, int, str]] = []  # (line number, indent, content)
    for n, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise AclConfigError(f"{path}:{n}: tabs are not allowed for indentation")
        line = _strip_comment(raw)
        if line.strip() in ("", "---"):
            continue
        lines.append((n, len(line) - len(line.lstrip(" ")), line.strip()))
    pos = 0

    def block(indent: int) -> Any:
        nonlocal pos
        if pos >= len(lines):
            return None
        _, ind, content = lines[pos]
        if content.startswith("- ") or content == "-":
            return seq(ind)
        return mapping(ind)

    def mapping(indent: int) -> dict[str, Any]:
        nonlocal pos
        out: dict[str, Any] = {}
        while pos < len(lines):
            n, ind, content = lines[pos]
            if ind < indent:
                break
            where = f"{path}:{n}"
            if ind > indent:
                raise AclConfigError(f"{where}: unexpected indentation")
            if content.startswith("-"):
                raise AclConfigError(f"{where}: a list item where a key was expected")
            m = _KEY_RE.match(content)
            if m is None:
                raise AclConfigError(f"{where}: expected 'key: value', got {content!r}")
            key, rest = m.group(1), m.group(2)
            if key in out:
                raise AclConfigError(f"{where}: {key!r} given twice")
            pos += 1
            if rest is not None and rest.strip():
                out[key] = _scalar(rest, where)
            elif pos < len(lines) and (
                lines[pos][1] > indent or (lines[pos][1] == indent and lines[pos][2].startswith("-"))
            ):
                out[key] = block(lines[pos][1])
            else:
                out[key] = None
        return out

    def seq(indent: int) -> list[Any]:
        nonlocal pos
        out: list[Any] = []
        while pos < len(lines):
            n, ind, content = lines[pos]
            if ind < indent or not (content.startswith("- ") or content == "-"):
                if ind > indent:
                    raise AclConfigError(f"{path}:{n}: unexpected indentation")
                break
            if ind > indent:
                raise AclConfigError(f"{path}:{n}: unexpected indentation")
            item = content[1:].strip()
            if not item:
                pos += 1
                out.append(block(lines[pos][1]) if pos < len(lines) and lines[pos][1] > indent else None)
                continue
            if _KEY_RE.match(item) and not item.startswith(("'", '"')):
                # "- key: value" opens a map whose other keys sit under the key's column
                lines[pos] = (n, ind + len(content) - len(item), item)
                out.append(mapping(lines[pos][1]))
                continue
            out.append(_scalar(item, f"{path}:{n}"))
            pos += 1
        return out

    doc = block(0) if lines else {}
    if pos < len(lines):
        raise AclConfigError(f"{path}:{lines[pos][0]}: unexpected indentation")
    if not isinstance(doc, dict):
        raise AclConfigError(f"{path}:1: the top level must be a map (globalWhiteRemoteAddresses, accounts)")
    return doc


def _line_of(text: str, needle: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return n
    return 1


def load_acl_config(text: str, path: str = "plain_acl.yml") -> AclConfig:
    """plain_acl.yml -> AclConfig, with PlainPermissionManager's checks; errors are ``file:line: problem``."""
    doc = parse_plain_acl_yaml(text, path)
    unknown = sorted(set(doc) - {"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
    if unknown:
        raise AclConfigError(f"{path}:{_line_of(text, unknown[0] + ':')}: unknown key {unknown[0]!r}")
    white = []
    for addr in _list(doc, "globalWhiteRemoteAddresses", path, text):
        try:
            white.append(address_matcher(addr))
        except ValueError as exc:
            raise AclConfigError(f"{path}:{_line_of(text, str(addr))}: {exc}") from None
    accounts: dict[str, PlainAccount] = {}
    for item in _list(doc, "accounts", path, text):
        if not isinstance(item, dict):
            raise AclConfigError(f"{path}:{_line_of(text, 'accounts:')}: every account must be a map")
        ak, sk = item.get("accessKey"), item.get("secretKey")
        where = f"{path}:{_line_of(text, f'accessKey: {ak}') if ak else _line_of(text, 'accounts:')}"
        if not ak or not sk or len(ak) <= ACCESS_KEY_MIN_LENGTH or len(sk) <= SECRET_KEY_MIN_LENGTH:
            raise AclConfigError(
                f"{where}: The accessKey={ak} and secretKey={sk} cannot be null "
                "and length should longer than 6"
            )
        if ak in accounts:
            raise AclConfigError(f"{where}: accessKey {ak} is given twice")
        admin = item.get("admin")
        if admin not in (None, "true", "false"):
            raise AclConfigError(f"{where}: admin must be true or false, got {admin!r}")
        try:
            matcher = address_matcher(item.get("whiteRemoteAddress"))
        except ValueError as exc:
            raise AclConfigError(f"{where}: {exc}") from None
        account = PlainAccount(
            ak,
            sk,
            admin == "true",
            parse_perm(item.get("defaultTopicPerm")),
            parse_perm(item.get("defaultGroupPerm")),
            white_remote_address=matcher,
        )
        for key, is_topic in (("groupPerms", False), ("topicPerms", True)):
            for entry in _list(item, key, path, text):
                name, eq, perm = str(entry).partition("=")
                if not eq or not name.strip() or "=" in perm:
                    raise AclConfigError(
                        f"{path}:{_line_of(text, str(entry))}: {entry!r}: "
                        "expected 'Res=Perm', e.g. topicA=SUB"
                    )
                if perm.strip() != "DENY" and parse_perm(perm) == DENY:
                    raise AclConfigError(
                        f"{path}:{_line_of(text, str(entry))}: {entry!r}: the permission must be SUB, PUB, "
                        "SUB|PUB, PUB|SUB or DENY"
                    )
                resource = name.strip() if is_topic else retry_topic(name.strip())
                account.resource_perms[resource] = parse_perm(perm)
        accounts[ak] = account
    return AclConfig(accounts, white)


def _list(doc: dict[str, Any], key: str, path: str, text: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise AclConfigError(f"{path}:{_line_of(text, key + ':')}: {key} must be a list")
    return value
