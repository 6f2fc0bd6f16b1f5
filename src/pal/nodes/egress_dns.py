"""The egress guard's questions to the resolver: a target's addresses, checked against the
guard's decision (pal.core.egress) before anything is claimed or sent. The caller connects to the
addresses `check` returns, never to the name again (DNS rebinding)."""

from __future__ import annotations

import ipaddress
import logging
import socket

from pal.core.egress import (
    Address,
    EgressRefused,
    Unresolvable,
    cached_allow_list,
    decide,
    is_localhost_name,
    normalize_host,
)

log = logging.getLogger(__name__)

_LOCALHOST = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


def resolve(host: str, port: int, *, numeric_only: bool = False) -> tuple[Address, ...]:
    """The addresses a connection to (`host`, `port`) could reach, in the resolver's order.

    Asked with AI_NUMERICHOST first, so an address literal in any spelling the C library accepts
    (127.1, 2130706433, 0x7f000001, ::ffff:127.0.0.1) is read without a DNS query; `numeric_only`
    stops there. Raises Unresolvable when the name does not resolve."""
    if is_localhost_name(normalize_host(host)):
        return _LOCALHOST
    # The name as the URL gave it: without its trailing dot a resolver could append search domains.
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        if numeric_only:
            raise Unresolvable(f"{host!r} is not an address literal") from None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise Unresolvable(f"cannot resolve {host!r}: {exc}") from None
    addresses: list[Address] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # a scope id is not an address
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise Unresolvable(f"cannot resolve {host!r}: no IPv4 or IPv6 address")
    return tuple(addresses)


def check(host: str, port: int, allow_entries: tuple[str, ...]) -> tuple[Address, ...]:
    """Resolve the target and apply the guard: the addresses to connect to, in order.

    Raises EgressRefused (nothing may be sent) or Unresolvable (nothing could be sent)."""
    addresses = resolve(host, port)
    why = decide(host, port, addresses, cached_allow_list(allow_entries))
    if why is not None:
        # The operator's log names the addresses; the step's error (which graph authors read) does
        # not, so it cannot be used to map what internal names resolve to.
        log.warning("egress refused: %s port %d resolves to %s (%s)", host, port,
                    ", ".join(map(str, addresses)), why)
        raise EgressRefused(
            f"egress refused: {host!r} port {port} is not a public address ({why}); graphs may not "
            "reach it unless the operator allows it in PAL_EGRESS_ALLOW (nothing was sent)")
    return addresses
