"""Where the site may send: public addresses only, unless a deployment allows a private host
by name or network (`AGENTSITE_OUTBOUND_ALLOWED_HOSTS`).

A webhook endpoint's URL, the OpenTelemetry collector's, and any later sender's are written by
people; an address that reaches the site's own machine or network (loopback, link-local such
as a cloud's metadata service at 169.254.169.254, private ranges, "this host" 0.0.0.0, and
every spelling of them: `[::1]`, `2130706433`, `0x7f000001`, `127.1`, an IPv4-mapped IPv6
address, a public name that resolves to one) must not be reachable through them.

The check is made where it counts: when connecting (`connect`, used by `common.outbound`'s
opener for every POST). The name is resolved once, each address it resolved to is checked, and
the connection is made to a checked address, so a name that resolves differently the second
time (DNS rebinding) reaches nothing unchecked. Forms check too (`refusal_for_url`), to say so
at once, but a form's check is advice: the name may resolve elsewhere later.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class DestinationRefused(OSError):
    """An address the deployment did not allow; what it says names the setting that would."""


@dataclass(frozen=True)
class Allowed:
    """`AGENTSITE_OUTBOUND_ALLOWED_HOSTS`: host names (exact, any case) and addresses or
    networks (`10.0.0.0/8`, `127.0.0.1`) that may be private."""

    names: frozenset[str]
    networks: tuple[Network, ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowed:
        names: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            text = entry.strip().strip("[]")
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                names.add(text.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        if host.lower().rstrip(".") in self.names:
            return True
        return any(address in network for network in self.networks)


def allowed() -> Allowed:
    return Allowed.parse(getattr(settings, "AGENTSITE_OUTBOUND_ALLOWED_HOSTS", []))


def _plain(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address):
        # ::ffff:127.0.0.1 reaches 127.0.0.1.
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return mapped
    return address


def kind(address: Address) -> str | None:
    """What makes `address` private ("loopback", "link-local", …); None for a public one."""
    plain = _plain(address)
    if plain.is_loopback:
        return "loopback"
    if plain.is_link_local:
        return "link-local"
    if plain.is_unspecified:
        return "unspecified (this host)"
    if plain.is_multicast:
        return "multicast"
    if plain.is_private:
        return "private"
    if not plain.is_global:
        return "reserved"
    return None


def refusal(host: str, address: Address, permitted: Allowed | None = None) -> str | None:
    """Why the site may not send to `address` (which `host` named); None when it may.
    `permitted`: the setting parsed (`allowed()`), when the caller checks several addresses."""
    what = kind(address)
    if what is None or (permitted or allowed()).allows(host, address):
        return None
    named = "" if host.strip("[]") == str(address) else f"{host} resolves to "
    return (
        f"{named}{address}, a {what} address: the site sends only to public addresses "
        "unless AGENTSITE_OUTBOUND_ALLOWED_HOSTS names this host or its network."
    )


def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    """`socket.getaddrinfo` for a TCP connection to `host`: every address it names."""
    return socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)


def checked(host: str, port: int) -> list[tuple[Any, ...]]:
    """The addresses of `host` the site may connect to; `DestinationRefused` when one of
    them is refused (a name that resolves to a public and a private address is refused
    whole: which one a connection takes is not the site's to choose)."""
    infos = resolve(host, port)
    permitted = allowed()
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        reason = refusal(host, address, permitted)
        if reason is not None:
            raise DestinationRefused(reason)
    return infos


def connect(
    target: tuple[str, int],
    timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
    source_address: tuple[str, int] | None = None,
    **kwargs: Any,
) -> socket.socket:
    """`socket.create_connection`, to a checked address of `target`'s host only."""
    host, port = target
    last: OSError | None = None
    for family, kind_, proto, _, sockaddr in checked(host, port):
        sock = socket.socket(family, kind_, proto)
        try:
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                sock.settimeout(timeout)
            if source_address is not None:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as failed:
            last = failed
            sock.close()
    raise last if last is not None else OSError(f"{host} has no address")


def refusal_for_url(url: str, *, resolving: bool = True) -> str | None:
    """A form's advice on `url`: why the site would not send there, or None. A name that
    does not resolve now is not refused here (it is checked again at each send); nor, not
    `resolving`, is any name (a system check at start-up asks no DNS server)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if not host:
        return None
    if not resolving:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
        return refusal(host, address)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        checked(host, port)
    except DestinationRefused as refused:
        return str(refused)
    except (OSError, ValueError, UnicodeError):
        return None
    return None
