"""Redaction that the operator and `kubectl tsoracle report` share: the forms a secret takes in
text, replacing them, and a Secret cut down to its keys.

It sits below `tsoracle/operator` because the plugin uses it too, and importing the operator
package registers the kopf handlers. Each user keeps its own policy on top: the operator hides
the whole backend URL and its host (`operator/redact.py`); the report hides only the Secret's
values and leaves addresses readable.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

from tsoracle.errors import ConfigError
from tsoracle.store import parse_url, secret_forms

REDACTED = "<redacted>"
SHORTEST = 3  # a shorter secret cannot be masked without garbling ordinary words
# Words in a setting's name that make it a credential, which belongs in the environment (from a
# Secret), never in arguments or a resource's spec where process lists and pod specs show it.
SECRET_WORDS = ("secret", "token", "password", "credential", "access-key", "account-key",
                "private-key")


def names_a_secret(key: str) -> bool:
    words = key.lower().replace("_", "-")
    return any(word in words for word in SECRET_WORDS)


def password_forms(url: str) -> list[str]:
    """The password and other secret parameters of a backend URL, raw and percent-encoded;
    none if the URL does not parse."""
    try:
        parsed = parse_url(url)
    except ConfigError:
        return []
    return [form for secret in {parsed.password, *parsed.secrets}
            for form in secret_forms(secret)]


def redact_texts(text: str, secrets: Iterable[str], mark: str = REDACTED) -> str:
    """`text` with each secret, in any letter case, replaced by `mark`."""
    # Longest first: a secret that is part of a longer one must not leave the rest readable.
    for s in sorted({s for s in secrets if len(s) >= SHORTEST}, key=len, reverse=True):
        text = re.sub(re.escape(s), mark, text, flags=re.IGNORECASE)
    return text


def secret_texts(values: Iterable[str]) -> list[str]:
    """Every form in which a Secret's values may appear in text: each value (raw, trimmed,
    percent-encoded and -decoded, base64) and, for a backend URL, its password. Hosts and
    other addresses are not secrets and stay readable."""
    found: set[str] = set()
    for value in values:
        for v in {value, value.strip()}:
            if not v:
                continue
            found |= {v, quote(v, safe=""), unquote(v), base64.b64encode(v.encode()).decode()}
            found.update(password_forms(v))
    return sorted((s for s in found if len(s) >= SHORTEST), key=len, reverse=True)


def redacted_secret(secret: dict[str, Any]) -> dict[str, Any]:
    """A Secret with its keys and metadata, never a value (annotations too: `kubectl apply`
    copies the whole Secret into one)."""
    meta = secret.get("metadata") or {}
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                     "labels": meta.get("labels") or {},
                     "annotations": {k: REDACTED for k in meta.get("annotations") or {}},
                     "creationTimestamp": meta.get("creationTimestamp")},
        "type": secret.get("type"),
        "data": {k: REDACTED for k in sorted(secret.get("data") or {})},
    }
