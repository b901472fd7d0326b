"""Secrets out of everything the service prints or writes: the one redaction rule (imports nothing here).

`redact(value)` masks the secrets of one URI-shaped value, `redact_text(text)` those of every URI inside a
longer message, `redact_values(obj)` every string inside a config dict. The rule works on the text with
regular expressions, never by parsing the URI, so a malformed one (`http://u:pw@[::1`, a scheme typo
`htp://u:pw@host`) is masked as well as a valid one:

- the password of the user-info part, `scheme://user:PASSWORD@host` -> `scheme://user:***@host`, for any
  scheme (SQLAlchemy's `postgresql+psycopg://` too). The user-info runs to the last `@` of the URI (a
  password may hold `@`, `/` or `:` unescaped), so when in doubt more is masked, never less;
- query parameters that carry secrets, matched case-insensitively by name: password, passwd, pwd, token,
  secret, key (access_key, api_key, AWSAccessKeyId), sig, signature, credential (X-Amz-Signature,
  X-Amz-Credential, X-Amz-Security-Token, a SAS token's sig): `?token=VALUE` -> `?token=***`.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# a scheme and `//`: RFC 3986's scheme characters (a typo such as `htp` is still a scheme)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# one URI inside a message: up to whitespace, a double quote, angle bracket or backtick
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"<>`]*")
# a query (or matrix, or fragment) parameter whose name says it is a secret
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&;#](?P<name>[^=&;#?\s]*?(?:password|passwd|pwd|token|secret|key|keyid|sig|signature|"
    r"credentials?))=)(?P<value>[^&;#\s]*)",
    re.IGNORECASE,
)


def _redact_uri(uri: str) -> str:
    """One URI (starting with `scheme://`), its user-info password and secret parameters masked."""
    m = _SCHEME.match(uri)
    if m is None:
        return uri
    head, rest = uri[: m.end()], uri[m.end() :]
    at = rest.rfind("@")
    if at >= 0:
        userinfo, after = rest[:at], rest[at:]
        user, colon, _password = userinfo.partition(":")
        # `scheme://host/path@x` (no colon before the path starts) has no user-info; anything else with a
        # colon does, even when it does not parse (`user:pw/with/slashes@host`, `host:5000/x@y`: masked)
        if colon and not any(c in user for c in "/?#"):
            rest = f"{user}:{MASK}{after}"
    return head + _SECRET_PARAM.sub(lambda p: p["lead"] + MASK, rest)


def redact(value: str) -> str:
    """`value` with its secrets masked: a URI as a whole, or every URI inside it."""
    if _SCHEME.match(value):
        return _redact_uri(value)
    return redact_text(value)


def redact_text(text: str) -> str:
    """`text` (a message, a traceback, a YAML dump) with the secrets of every URI in it masked."""
    if "://" not in text:
        return text
    return _URI_IN_TEXT.sub(lambda m: _redact_uri(m[0]), text)


def redact_values(obj: Any) -> Any:
    """A copy of `obj` (dicts, lists, tuples of strings and other values) with every string redacted."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_values(v) for v in obj)
    return obj


def has_credentials(uri: str) -> bool:
    """True when `uri` carries a secret that `redact` would mask."""
    return redact(uri) != uri
