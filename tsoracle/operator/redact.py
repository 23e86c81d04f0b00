"""Keep the backend URL out of what users see (status, Events, logs, reports).

The library already masks passwords; the operator goes further because the whole URL is the
Secret's value: the URL in any form, the password and the host (in any letter case) are
replaced, whether or not the URL parses.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from tsoracle.errors import ConfigError
from tsoracle.store import parse_url, secret_forms


def redact(text: str, url: str | None) -> str:
    if not url:
        return text
    secrets = [url, url.strip()]
    try:
        parsed = parse_url(url)
    except ConfigError:
        parsed = None
    if parsed is not None:
        secrets.append(parsed.safe)
        for secret in {parsed.password, *parsed.secrets}:
            secrets += secret_forms(secret)
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
    for s in sorted({s for s in secrets if len(s) > 2}, key=len, reverse=True):
        text = re.sub(re.escape(s), "<backend>", text, flags=re.IGNORECASE)
    return text
