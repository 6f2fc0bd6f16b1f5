"""The egress guard: which network targets a graph may make a worker connect to.

A graph's `connector` node names its own URL, so without a guard any graph author could make a
worker call its loopback admin ports, the cloud metadata service or the private network, read
the answer back through the journal, and port-scan by error text (docs/side-effects.md). The guard:

1. resolves the host once (pal.nodes.egress_dns.resolve, getaddrinfo; `localhost` names are
   loopback by definition and never asked of a resolver),
2. refuses the target when ANY resolved address is not public (`refusal_reason`: loopback, private,
   link-local, multicast, unspecified, reserved, CGNAT, cloud metadata, and the IPv6 forms that
   embed one of those IPv4 addresses), unless the operator's PAL_EGRESS_ALLOW covers it (`decide`),
3. hands back the checked addresses: the caller connects to one of THOSE, never to the name again,
   so a DNS answer that changes between the check and the connection (DNS rebinding) cannot
   redirect it.

This module holds the decision (`refusal_reason`, `decide`, `parse_allow_list`), pure and tested
without any traffic; pal.nodes.egress_dns asks the resolver and applies it (`check`).
A refusal raises `EgressRefused` before anything is claimed or sent: it says nothing about whether
a port is open, since no connection was attempted.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from pal.errors import ConfigError, DeliveryError, StepError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_SYNTAX = ("a host name, an IP address or a CIDR network, each optionally with :port "
                "(e.g. 127.0.0.1:8080,10.0.0.0/8,[fd00::/8]:443,hooks.internal)")


class EgressRefused(StepError):
    """A delivery target is not a public address and PAL_EGRESS_ALLOW does not name it; nothing was
    sent. Not retryable: its class matches no `retryableClasses`, since the answer will not change."""

    code = "egress_refused"
    error_class = "policy"


class Unresolvable(DeliveryError):
    """The target's host name did not resolve: nothing was sent (a definite failure)."""


# Cloud instance-metadata endpoints, named first so that a refusal says what they are (each is
# also inside a refused range below).
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle
    "169.254.170.2",  # AWS ECS task metadata
    "fd00:ec2::254",  # AWS over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud (legacy)
))

_V4_REFUSED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved (IETF protocol assignments)"),
    ("192.0.2.0/24", "reserved (documentation)"),
    ("192.88.99.0/24", "reserved (6to4 relay)"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "reserved (benchmarking)"),
    ("198.51.100.0/24", "reserved (documentation)"),
    ("203.0.113.0/24", "reserved (documentation)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),  # includes the broadcast address 255.255.255.255
)
_V6_REFUSED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "reserved (local NAT64)"),  # before ::/8, which holds it: the first match names it
    ("::/8", "reserved"),  # IPv4-compatible ::a.b.c.d and SIIT forms; IPv4-mapped is unwrapped first
    ("100::/64", "reserved (discard)"),
    ("2001::/23", "reserved (IETF protocol assignments, Teredo)"),
    ("2001:db8::/32", "reserved (documentation)"),
    ("3fff::/20", "reserved (documentation)"),
    ("fc00::/7", "private (unique local)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
_REFUSED: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), why) for net, why in (*_V4_REFUSED, *_V6_REFUSED))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (IPv4-mapped, NAT64, 6to4), else None.

    A connection to ::ffff:127.0.0.1 IS a connection to 127.0.0.1; NAT64 and 6to4 gateways
    translate the embedded address, so each is judged as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def refusal_reason(address: Address) -> str | None:
    """Why a graph may not reach `address` on its own ("loopback", "private", …); None if public."""
    inner = embedded_ipv4(address)
    if inner is not None:
        why = refusal_reason(inner)
        return None if why is None else f"{why} (an IPv4 address inside IPv6)"
    if address in METADATA:
        return "cloud metadata"
    for network, why in _REFUSED:
        if address in network:
            return why
    # Whatever Python's own tables also call non-public (they grow with new IANA assignments).
    if (address.is_loopback or address.is_private or address.is_link_local or address.is_multicast
            or address.is_unspecified or address.is_reserved or not address.is_global):
        return "reserved"
    return None


@dataclass(frozen=True)
class AllowEntry:
    """One PAL_EGRESS_ALLOW entry: a host name or a network, and optionally a port."""

    text: str  # normalized, as Settings keeps it
    host: str | None = None
    network: Network | None = None
    port: int | None = None

    def covers_host(self, host: str, port: int) -> bool:
        """A host-name entry naming `host` (normalized) and allowing `port`."""
        return self.host is not None and self.host == host and self.port in (None, port)

    def covers_address(self, address: Address, port: int) -> bool:
        """A network entry holding `address` (or the IPv4 address it embeds) and allowing `port`."""
        if self.network is None or self.port not in (None, port):
            return False
        inner = embedded_ipv4(address)
        return address in self.network or (inner is not None and inner in self.network)


_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")
_BRACKETED = re.compile(r"^\[(?P<inner>[^\[\]]+)\](?::(?P<port>[^:]*))?\Z")


def normalize_host(host: str) -> str:
    """A host name as the guard compares it: lowercase, without the root's trailing dot."""
    host = host.strip().lower()
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def parse_allow_entry(raw: str) -> AllowEntry:
    """One entry of PAL_EGRESS_ALLOW; ConfigError naming it when it cannot be used."""
    text = raw.strip()

    def bad(why: str) -> ConfigError:
        return ConfigError(f"PAL_EGRESS_ALLOW entry {text!r}: {why}; each entry is {ALLOW_SYNTAX}")

    bracketed = _BRACKETED.match(text)
    if bracketed:
        target, port_text = bracketed["inner"], bracketed["port"]
        if ":" not in target:
            raise bad("brackets are for IPv6 addresses only")
    elif text.count(":") >= 2:
        target, port_text = text, None  # a bare IPv6 address or network: no port without brackets
    elif ":" in text:
        target, port_text = text.rsplit(":", 1)
    else:
        target, port_text = text, None
    port = None
    if port_text is not None:
        if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise bad(f"port {port_text!r} is not a number from 1 to 65535")
        port = int(port_text)
    if not target:
        raise bad("it names no host")
    if "/" in target or ":" in target or target.replace(".", "").isdigit():
        try:
            network = ipaddress.ip_network(target, strict=True)
        except ValueError as exc:
            raise bad(f"not an IP address or CIDR network ({exc})") from None
        canonical = str(network.network_address) if network.num_addresses == 1 else str(network)
        if port is not None:
            canonical = f"[{canonical}]:{port}" if network.version == 6 else f"{canonical}:{port}"
        return AllowEntry(text=canonical, network=network, port=port)
    host = normalize_host(target)
    if _is_ipv4_spelling(host):
        raise bad("an IPv4 address must be written as four decimal numbers (a.b.c.d)")
    if not host.isascii() or len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
        raise bad("not a valid host name (ASCII letters, digits, '-', '_' and dots; IDNA as xn--…)")
    return AllowEntry(text=host if port is None else f"{host}:{port}", host=host, port=port)


def _is_ipv4_spelling(host: str) -> bool:
    """True for the shorthand spellings the C resolver reads as IPv4 (0x7f.1, 2130706433, 127.1)."""
    try:
        socket.inet_aton(host)
    except (OSError, ValueError):  # UnicodeError and an embedded NUL are ValueErrors
        return False
    return True


def is_address_literal(host: str) -> bool:
    """True when `host` is an IP address in any spelling (so TLS verifies it as an address)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return _is_ipv4_spelling(host)
    return True


def parse_allow_list(entries: str | Iterable[str]) -> tuple[AllowEntry, ...]:
    """PAL_EGRESS_ALLOW as entries: a comma-separated string, or the entries Settings keeps."""
    items = entries.split(",") if isinstance(entries, str) else entries
    return tuple(parse_allow_entry(item) for item in items if item.strip())


@lru_cache(maxsize=32)
def cached_allow_list(entries: tuple[str, ...]) -> tuple[AllowEntry, ...]:  # parsed once per list
    return parse_allow_list(entries)


def is_localhost_name(host: str) -> bool:
    """`localhost` and `*.localhost` are loopback by definition (RFC 6761), whatever DNS says."""
    return host == "localhost" or host.endswith(".localhost")


def decide(host: str, port: int, addresses: Sequence[Address],
           allow: Sequence[AllowEntry]) -> str | None:
    """Why the target (`host`, `port`, resolved to `addresses`) is refused, or None when allowed.

    Pure. A host-name entry covers every address its name resolves to (the operator vouches for
    the name); otherwise EVERY address must be public or covered by an address entry: a name that
    resolves to one public and one private address is refused, since the connection could take
    either."""
    host = normalize_host(host)
    if any(entry.covers_host(host, port) for entry in allow):
        return None
    if not addresses:
        return "unresolved"
    for address in addresses:
        why = refusal_reason(address)
        if why is not None and not any(entry.covers_address(address, port) for entry in allow):
            return why
    return None
