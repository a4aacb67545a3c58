"""Passwords out of URLs, and URL errors that never quote them.

A password may hold any character: ``@`` and ``:`` parse as they are (the host starts after
the *last* ``@``), while ``/``, ``#`` and ``?`` end the host part for ``urlsplit`` unless
percent-encoded, and its errors then quote a piece of the password as "the port". So
redaction hides everything between ``//user:`` and the last ``@``, and a URL that does not
parse gets a fixed reason that quotes nothing.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# //user: then everything up to the last @ of the same whitespace-free run
_PASSWORD = re.compile(r"(//[^:/@\s]*:)\S*@")
# redis-py also takes ?password=... (unix:///run/redis.sock?db=0&password=...)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.IGNORECASE)
UNENCODED = ("a character of the password must be percent-encoded: / as %2F, # as %23, "
             "? as %3F")


def redact(text: str) -> str:
    """``text`` (a log line, an error, a traceback) with the password of every URL in it
    replaced by ``***``: from ``//user:`` to the last ``@`` before the next whitespace, and
    any ``password=`` query parameter."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***@", text))


def redact_url(url: str) -> str:
    """One URL with its password replaced by ``***``, whatever characters the password holds
    (whitespace too): everything between ``//user:`` and the URL's last ``@``."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return redact(url)
    user, colon, _ = rest[:at].partition(":")
    tail = _QUERY_PASSWORD.sub(r"\1***", rest[at + 1:])
    return f"{scheme}://{user}{':***' if colon else ''}@{tail}"


def unencoded_password(url: str) -> bool:
    """Whether ``url``'s last ``@`` lies past where ``urlsplit`` ends the host part (at the
    first ``/``, ``?`` or ``#``): a password holding one of them unencoded."""
    rest = url.partition("://")[2]
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return rest.rfind("@") >= len(netloc)


def authority_problem(url: str) -> str | None:
    """Why ``urlsplit`` cannot read ``url``'s host and port, in fixed words that quote
    nothing of the URL (``None`` when it can)."""
    try:
        urlsplit(url).port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        if unencoded_password(url):
            return UNENCODED
        if "IPv6" in str(exc):
            return "invalid IPv6 address in brackets"
        if "out of range" in str(exc):
            return "port out of range 0-65535"
        return "the port is not a number"
    return None
