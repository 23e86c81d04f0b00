"""Ground floor: URLs, dialects, connection pools, retries, schema. Knows nothing of oracles."""

from tsoracle.store.backend import Backend, Rows, Statement, Tx, open_backend
from tsoracle.store.dialect import U64_MAX
from tsoracle.store.retry import RetryPolicy
from tsoracle.store.url import (
    DEFAULT_URL,
    BackendURL,
    has_schema,
    parse_url,
    secret_forms,
    url_with_schema,
    with_schema,
)

__all__ = [
    "DEFAULT_URL",
    "U64_MAX",
    "Backend",
    "BackendURL",
    "RetryPolicy",
    "Rows",
    "Statement",
    "Tx",
    "open_backend",
    "has_schema",
    "parse_url",
    "secret_forms",
    "url_with_schema",
    "with_schema",
]
