"""Keep the backend URL out of what users see (status, Events, logs).

The library already masks passwords; the operator goes further because the whole URL is the
Secret's value: the URL in any form, the password, and the host are replaced.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from tsoracle.errors import ConfigError
from tsoracle.store import parse_url


def redact(text: str, url: str | None) -> str:
    if not url:
        return text
    secrets = [url]
    try:
        secrets.append(parse_url(url).safe)
    except ConfigError:
        pass
    try:
        parts = urlsplit(url)
        secrets += [parts.password or "", parts.hostname or ""]
        if parts.hostname and parts.port:
            secrets.append(f"{parts.hostname}:{parts.port}")
    except ValueError:
        pass
    for s in sorted((s for s in secrets if len(s) > 2), key=len, reverse=True):
        text = text.replace(s, "<backend>")
    return text
