"""Whether a URL a member announces can be reached from another machine.

A relay bound to every interface (`--host 0.0.0.0`) that announces its bind address
hands workers `http://0.0.0.0:8802`, which names no machine: each worker would try
its own. Such URLs are refused where they are announced.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def unroutable(url: str) -> str | None:
    """Why no other machine can reach `url` (no host, or an unspecified address such as
    0.0.0.0 or ::), or None when it names a host."""
    try:
        host = urlsplit(url).hostname
    except ValueError as exc:
        return f"not a URL ({exc})"
    if not host:
        return "it names no host"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: resolved by whoever fetches from it
    if address.is_unspecified:
        return f"{host} means 'every interface' to a server, not an address others can reach"
    return None
