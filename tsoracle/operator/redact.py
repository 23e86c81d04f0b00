"""Keep the backend URL out of what users see (status, Events, logs, reports).

The library already masks passwords; the operator goes further because the whole URL is the
Secret's value: the URL in any form, the password and the host (in any letter case) are
replaced, whether or not the URL parses. The password's forms and the replacing come from
`tsoracle/redact.py`, which `kubectl tsoracle report` uses as well.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from tsoracle.errors import ConfigError
from tsoracle.redact import password_forms, redact_texts
from tsoracle.store import parse_url

# Where the server is, as libpq and the pool spell it, whatever the URL said (`localhost`
# resolves to addresses that appear nowhere in the URL).
_ADDRESSES = [
    # psycopg's repr of a connection: <psycopg.AsyncConnection [IDLE] (host=… port=… user=…
    # database=…) at 0x…>, which its pool logs when it discards or rolls one back.
    (re.compile(r"\((?:host|hostaddr|port)=[^()]*\)"), "(<backend>)"),
    (re.compile(r'(server (?:at|on socket)) "[^"]*"(?:\s*\([^)]*\))?'), r"\1 <backend>"),
    (re.compile(r'(host name) "[^"]*"'), r"\1 <backend>"),
    (re.compile(r"\b(host|hostaddr|port): '[^']*'"), r"\1: '<backend>'"),
    (re.compile(r",?\s*\bport \d+"), ""),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<backend>"),
    (re.compile(r"\[?\b(?:[0-9A-Fa-f]{1,4}:){1,7}:(?:[0-9A-Fa-f]{1,4}:?){0,6}\]?"
                r"|(?<![\w:])::1\b"), "<backend>"),
]


def redact_addresses(text: str) -> str:
    """Remove server addresses, ports and socket paths from a driver message."""
    for pattern, repl in _ADDRESSES:
        text = pattern.sub(repl, text)
    return text


def redact(text: str, url: str | None) -> str:
    """`text` without the backend URL, its password and host, or any server address."""
    if not url:
        return redact_addresses(text)
    secrets = [url, url.strip(), *password_forms(url)]
    try:
        parsed = parse_url(url)
    except ConfigError:
        parsed = None
    if parsed is not None:
        secrets.append(parsed.safe)
        if parsed.host:
            secrets += [parsed.host, *parsed.host.split(",")]
    # What a URL that does not parse may still hold: everything between :// and the last @
    # (user and password, whatever they contain) and the words around it.
    if "://" in url:
        rest = url.split("://", 1)[1]
        if "@" in rest:
            cred, _, after = rest.rpartition("@")
            secrets += [cred, unquote(cred), *cred.split(":", 1)[1:]]
            secrets.append(re.split(r"[/?#:]", after, maxsplit=1)[0])
        try:
            parts = urlsplit(url)
            secrets += [parts.password or "", parts.hostname or ""]
        except ValueError:
            pass
    return redact_addresses(redact_texts(text, secrets, "<backend>"))
