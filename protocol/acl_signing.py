"""Request signing as RocketMQ 4.9's ACL does it (AclClientRPCHook, AclUtils, AclSigner), sans-IO.

A signed request carries ``AccessKey`` (and ``SecurityToken`` when there is one) and ``Signature`` among
its header fields. The signature is Base64(HmacSHA1(secretKey, content)), where content is the values
of every other header field in key order, concatenated, followed by the body bytes.

On the native port those are the strings and the body bytes exactly as sent. A msgpack frame has typed
values and a decoded body, so its content is defined on a canonical form (PROTOCOL.md has no ACL
section; README "ACL"): each value as the native port writes it (``true``/``false``, decimal numbers,
strings as they are, anything else as compact JSON), and the body as msgpack re-encodes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# MixAll.UNIQUE_MSG_QUERY_FLAG: left out of the content by the broker.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"

ENV_ACCESS_KEY = "RMQ_ACCESS_KEY"
ENV_SECRET_KEY = "RMQ_SECRET_KEY"


@dataclass(frozen=True, slots=True)
class SessionCredentials:
    access_key: str
    secret_key: str
    security_token: str | None = None

    @classmethod
    def resolve(
        cls, access_key: str | None, secret_key: str | None, environ: Mapping[str, str] | None = None
    ) -> SessionCredentials | None:
        """Credentials from explicit values, else from RMQ_ACCESS_KEY / RMQ_SECRET_KEY; None when
        neither gives a key. One of the pair without the other is a ValueError naming the missing one."""
        env = os.environ if environ is None else environ
        ak = access_key if access_key is not None else env.get(ENV_ACCESS_KEY)
        sk = secret_key if secret_key is not None else env.get(ENV_SECRET_KEY)
        if not ak and not sk:
            return None
        if not ak:
            raise ValueError(
                f"a secret key was given without an access key (--access-key or {ENV_ACCESS_KEY})"
            )
        if not sk:
            raise ValueError(
                f"an access key was given without a secret key (--secret-key or {ENV_SECRET_KEY})"
            )
        return cls(ak, sk)


@dataclass(frozen=True, slots=True)
class SignedContent:
    """What a request says about who sent it: the key, the signature and the bytes it signs."""

    access_key: str | None
    signature: str | None
    security_token: str | None
    content: bytes


def native_signed_content(ext: Mapping[str, Any], body: bytes | None) -> SignedContent | None:
    """The ACL material of a native request (header fields as sent), or None when it names no key."""
    access_key = ext.get(ACCESS_KEY)
    if access_key is None:
        return None
    fields = {k: s for k, v in ext.items() if (s := wire_string(v)) is not None}
    return SignedContent(
        fields.get(ACCESS_KEY),
        fields.get(SIGNATURE),
        fields.get(SECURITY_TOKEN),
        combine_request_content(fields, body) if access_key else b"",
    )


def msgpack_signed_content(ext: Mapping[str, Any], body: Any) -> SignedContent | None:
    """The ACL material of a msgpack request, or None when it names no key."""
    access_key = ext.get(ACCESS_KEY)
    if access_key is None:
        return None
    return SignedContent(
        wire_string(access_key),
        wire_string(ext.get(SIGNATURE)),
        wire_string(ext.get(SECURITY_TOKEN)),
        msgpack_content(ext, body),
    )


def cal_signature(data: bytes, secret_key: str) -> str:
    """AclSigner.calSignature: Base64 of HmacSHA1 over ``data`` keyed with the UTF-8 secret."""
    mac = hmac.new(secret_key.encode("utf-8"), data, hashlib.sha1).digest()
    return base64.b64encode(mac).decode("ascii")


def combine_request_content(fields: Mapping[str, str], body: bytes | None) -> bytes:
    """AclUtils.combineRequestContent over the header fields (Signature and the unique-key flag left
    out) in key order, then the body."""
    text = "".join(
        fields[k]
        for k in sorted(fields)
        if k != SIGNATURE and k != UNIQUE_MSG_QUERY_FLAG and fields[k] is not None
    )
    return text.encode("utf-8") + (body or b"")


def wire_string(value: Any) -> str | None:
    """A typed header value as the native port writes it (the canonical form for msgpack signing)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def msgpack_content(ext: Mapping[str, Any], body: Any) -> bytes:
    """The signed content of a msgpack command (see the module docstring)."""
    fields: dict[str, str] = {}
    for k, v in ext.items():
        s = wire_string(v)
        if s is not None:
            fields[k] = s
    raw = msgpack.packb(body, use_bin_type=True) if body is not None else b""
    return combine_request_content(fields, raw)


def sign_ext(ext: dict[str, Any], body: Any, credentials: SessionCredentials) -> None:
    """AclClientRPCHook.doBeforeRequest for a msgpack command: add the key (and token), then the
    signature over everything else."""
    ext.pop(SIGNATURE, None)
    ext[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        ext[SECURITY_TOKEN] = credentials.security_token
    ext[SIGNATURE] = cal_signature(msgpack_content(ext, body), credentials.secret_key)
