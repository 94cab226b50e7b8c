"""Where a person's webhook contact may point (review104 finding 13: server-side request forgery).

Any user may add a webhook or Slack contact to themselves, and when a page reaches them the
server POSTs to it from inside the cluster network. So its host must not be the server itself or
its neighbours: every address the host resolves to must be public. Loopback, link-local (cloud
metadata at 169.254.169.254), private (10/8, 172.16/12, 192.168/16, fc00::/7), shared,
reserved, multicast and unspecified addresses are refused, unless an admin lists their network
in `CORRAL_WEBHOOK_ALLOW_NETWORKS` (comma-separated CIDRs, e.g. `10.20.0.0/16` for an
in-house chat server). It is checked when the contact is added (a name that does not resolve
then is let through: DNS may be internal or down) and again at every send, where the request
then goes to the very address checked (DNS may answer differently the second time), with the
host name kept for the Host header and TLS (docs/operations.md, "Notifications").
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

import httpx

from corral.config import parse_networks

__all__ = ["Unresolved", "WebhookRefused", "checked_addresses", "parse_networks", "port_of"]

SETTING = "CORRAL_WEBHOOK_ALLOW_NETWORKS"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookRefused(Exception):
    """The webhook's host is, or resolves to, an address contacts may not reach."""


class Unresolved(WebhookRefused):
    """The host name does not resolve (now)."""


# IPv6 forms that carry an IPv4 address a router or the host may hand on to IPv4: NAT64's
# well-known prefix (RFC 6052) and the deprecated IPv4-compatible form (::a.b.c.d)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to (mapped, 6to4, NAT64, IPv4-compatible), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or address in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def _kind(address: Address) -> str | None:
    """What makes `address` off limits, or None for a public one. An IPv6 address that leads to
    an IPv4 one is judged by both (review105: NAT64 64:ff9b::a00:5 is 10.0.0.5)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None and (kind := _kind(inner)) is not None:
            return kind
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_private or not address.is_global:
        return "private or reserved"
    return None


def check_ip(host: str, address: Address, allowed: Sequence[Network]) -> None:
    if any(address in network for network in allowed if network.version == address.version):
        return
    kind = _kind(address)
    if kind is not None:
        shown = host if host == str(address) else f"{host} ({address})"
        raise WebhookRefused(
            f"the webhook's host {shown} is a {kind} address, which contacts may not reach; an "
            f"admin may allow its network with {SETTING}"
        )


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` stands for, in the resolver's order (an IP literal: itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Unresolved(f"the webhook's host {host} does not resolve: {exc}") from exc
    out: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).partition("%")[0])  # no IPv6 zone id
        if address not in out:
            out.append(address)
    return out


def port_of(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def checked_addresses(host: str, port: int, allowed: Sequence[Network]) -> list[Address]:
    """The addresses of `host`, each one allowed; else WebhookRefused naming the first that is
    not (a name with one public and one private address is refused: it could be either)."""
    addresses = resolve(host, port)
    for address in addresses:
        check_ip(host, address, allowed)
    return addresses
