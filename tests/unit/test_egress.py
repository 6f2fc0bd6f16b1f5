"""The egress guard (pal.core.egress) and the connector's and email's input checks, without traffic.

Address spellings are read by the C library's own parser (getaddrinfo with AI_NUMERICHOST, which
never asks DNS) and `localhost` names are never sent to a resolver, so nothing here leaves the
machine; public addresses are judged by the pure decision only, never resolved or contacted.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.config import load_settings
from pal.core import egress
from pal.core.egress import (
    EgressRefused,
    decide,
    parse_allow_entry,
    parse_allow_list,
    refusal_reason,
)
from pal.errors import ConfigError, GraphError
from pal.nodes import egress_dns
from pal.nodes.connector import FORBIDDEN_HEADERS, header_problem
from pal.nodes.egress_dns import resolve
from pal.nodes.email import one_address
from pal.plan.graph import parse_graph

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address

# Networks a graph may not reach on its own, and one address of each that must be refused.
REFUSED_V4 = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
              "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "192.0.0.0/24", "198.18.0.0/15"]
REFUSED_V6 = ["::1/128", "::/128", "fe80::/10", "fc00::/7", "ff00::/8", "fec0::/10", "2001:db8::/32"]
METADATA = ["169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2"]
PUBLIC_V4 = ["8.0.0.0/8", "1.0.0.0/16", "93.184.0.0/16", "151.101.0.0/16", "185.199.108.0/22"]
PUBLIC_V6 = ["2606:4700::/32", "2a00:1450::/32", "2001:4860::/32", "2620:fe::/48"]


def in_network(cidr: str) -> st.SearchStrategy[Any]:
    network = ipaddress.ip_network(cidr)
    first = int(network.network_address)
    return st.integers(first, first + network.num_addresses - 1).map(
        lambda n: V4(n) if network.version == 4 else V6(n))


refused_v4 = st.sampled_from(REFUSED_V4).flatmap(in_network)
refused_v6 = st.sampled_from(REFUSED_V6).flatmap(in_network)
public_v4 = st.sampled_from(PUBLIC_V4).flatmap(in_network)
public_v6 = st.sampled_from(PUBLIC_V6).flatmap(in_network)


@st.composite
def v4_spelling(draw: st.DrawFn, address: V4) -> str:
    """One of the spellings inet_aton (hence getaddrinfo) reads as `address`."""
    n = int(address)
    a, b, c, d = address.packed

    def part(value: int) -> str:
        form = draw(st.sampled_from(["dec", "hex", "HEX", "oct"]))
        if form == "hex":
            return hex(value)
        if form == "HEX":
            return "0X" + format(value, "X")
        return "0" + format(value, "o") if form == "oct" and value else str(value)

    return draw(st.sampled_from([
        str(address),
        part(n),  # 2130706433, 0x7f000001, 017700000001
        f"{part(a)}.{part(b)}.{part(c)}.{part(d)}",  # 0177.0.0.1, 0x7f.0.0.0x1
        f"{part(a)}.{part(b)}.{part((c << 8) | d)}",  # 127.0.1
        f"{part(a)}.{part((b << 16) | (c << 8) | d)}",  # 127.1
    ]))


@st.composite
def v6_spelling(draw: st.DrawFn, address: V6) -> str:
    """`address` written compressed, exploded, in capitals, or with a dotted IPv4 tail."""
    text = draw(st.sampled_from([address.compressed, address.exploded]))
    if draw(st.booleans()):
        text = text.upper()
    return text


@st.composite
def embedding(draw: st.DrawFn, inner: V4) -> str:
    """`inner` inside IPv6: IPv4-mapped (dotted or hex), NAT64 or 6to4."""
    n = int(inner)
    form = draw(st.sampled_from(["mapped", "mapped-hex", "nat64", "6to4"]))
    if form == "mapped":
        return f"::ffff:{inner}"
    if form == "mapped-hex":
        return str(V6((0xFFFF << 32) | n)).upper() if draw(st.booleans()) else str(V6((0xFFFF << 32) | n))
    if form == "nat64":
        return str(V6((0x64FF9B << 96) | n))
    return str(V6((0x2002 << 112) | (n << 80)))


def host_of(spelling: str, port: int = 8080) -> str:
    """The host a connector takes from a URL naming `spelling` (brackets for IPv6), as httpx reads it.

    httpx itself refuses some spellings (0177.0.0.01: four dotted parts that are not decimal), which
    fails the step before anything is claimed; the guard must refuse them all the same."""
    netloc = f"[{spelling}]" if ":" in spelling else spelling
    try:
        return httpx.URL(f"http://{netloc}:{port}/hook").raw_host.decode("ascii")
    except httpx.InvalidURL:
        return spelling


def assert_refused(spelling: str, port: int = 8080) -> None:
    host = host_of(spelling, port)
    addresses = resolve(host, port, numeric_only=True)  # read as a literal: never a DNS query
    assert decide(host, port, addresses, ()) is not None, (spelling, addresses)
    with pytest.raises(EgressRefused) as info:
        egress_dns.check(host, port, ())
    assert info.value.code == "egress_refused" and info.value.error_class == "policy"


# --- refused ---------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_spelling_of_a_non_public_ipv4_address_is_refused(data: st.DataObject) -> None:
    address = data.draw(refused_v4 | st.sampled_from([V4(a) for a in METADATA if ":" not in a]))
    assert_refused(data.draw(v4_spelling(address)))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_spelling_of_a_non_public_ipv6_address_is_refused(data: st.DataObject) -> None:
    address = data.draw(refused_v6 | st.just(V6("fd00:ec2::254")))
    assert_refused(data.draw(v6_spelling(address)))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_ipv4_inside_ipv6_is_judged_as_the_ipv4_address(data: st.DataObject) -> None:
    assert_refused(data.draw(refused_v4.flatmap(embedding)))


@given(st.sampled_from(["localhost", "LOCALHOST", "LocalHost.", "localhost.", "api.localhost",
                        "Admin.LOCALHOST."]))
def test_localhost_names_are_loopback_without_asking_a_resolver(name: str) -> None:
    assert set(resolve(name, 80)) == {V4("127.0.0.1"), V6("::1")}
    with pytest.raises(EgressRefused, match="loopback"):
        egress_dns.check(name, 80, ())


@pytest.mark.parametrize("address", METADATA)
def test_cloud_metadata_addresses_are_named(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) == "cloud metadata"


@pytest.mark.parametrize(("spelling", "reason"), [
    ("127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"), ("0", "unspecified"), ("::", "unspecified"),
    ("::1", "loopback"), ("10.1.2.3", "private"), ("100.64.0.1", "shared (CGNAT)"),
    ("169.254.0.1", "link-local"), ("fe80::1", "link-local"), ("fc00::1", "private (unique local)"),
    ("ff02::1", "multicast"), ("239.1.1.1", "multicast"), ("255.255.255.255", "reserved"),
    ("::ffff:127.0.0.1", "loopback (an IPv4 address inside IPv6)"),
    ("::127.0.0.1", "reserved"), ("64:ff9b:1::1", "reserved (local NAT64)"),
])
def test_refusals_say_why(spelling: str, reason: str) -> None:
    [address] = resolve(spelling, 80, numeric_only=True)
    assert refusal_reason(address) == reason


def test_one_non_public_address_among_public_ones_refuses_the_target() -> None:
    assert decide("hooks.example", 443, [V4("93.184.216.34"), V4("10.0.0.7")], ()) == "private"
    assert decide("hooks.example", 443, [V6("2606:4700::1"), V6("::1")], ()) == "loopback"


def test_the_refusal_says_nothing_about_the_port_or_the_resolved_address() -> None:
    """No port-scan oracle: nothing is connected to, so an open and a closed port read alike."""
    messages = []
    for port in (22, 5432, 6379, 65000):
        with pytest.raises(EgressRefused) as info:
            egress_dns.check("127.0.0.1", port, ())
        messages.append(str(info.value).replace(str(port), "PORT"))
    assert len(set(messages)) == 1 and "nothing was sent" in messages[0]
    with pytest.raises(EgressRefused) as named:
        egress_dns.check("db.localhost", 5432, ())
    assert "127.0.0.1" not in str(named.value) and "::1" not in str(named.value)


# --- accepted (pure decision: never resolved, never contacted) -------------------------------------

@settings(max_examples=300)
@given(public_v4 | public_v6)
def test_public_addresses_are_accepted(address: egress.Address) -> None:
    assert refusal_reason(address) is None
    assert decide("hooks.example.com", 443, [address], ()) is None


@settings(max_examples=100)
@given(public_v4)
def test_a_public_ipv4_address_inside_ipv6_is_accepted(address: V4) -> None:
    assert decide("hooks.example.com", 443, [V6((0xFFFF << 32) | int(address))], ()) is None


# --- PAL_EGRESS_ALLOW ---------------------------------------------------------------------------------

def test_allow_list_entries_are_read_and_normalized() -> None:
    raw = " 127.0.0.1:8080 , 10.0.0.0/8,,Hooks.Internal. ,[::1]:9000, fd00::/8, [fd00::/8]:443, 10.0.0.0/8:443"
    assert load_settings({"PAL_EGRESS_ALLOW": raw}).egress_allow == (
        "127.0.0.1:8080", "10.0.0.0/8", "hooks.internal", "[::1]:9000", "fd00::/8", "[fd00::/8]:443",
        "10.0.0.0/8:443")
    assert load_settings({}).egress_allow == ()
    for text in load_settings({"PAL_EGRESS_ALLOW": raw}).egress_allow:
        assert parse_allow_entry(text).text == text  # what Settings keeps reads back the same


@pytest.mark.parametrize(("raw", "fragment"), [
    ("10.0.0.1/8", "has host bits set"),
    ("127.0.0.1:0", "not a number from 1 to 65535"),
    ("127.0.0.1:70000", "not a number from 1 to 65535"),
    ("127.0.0.1:http", "not a number from 1 to 65535"),
    ("hooks.internal:", "not a number from 1 to 65535"),
    ("*", "not a valid host name"),
    ("*.internal", "not a valid host name"),
    ("http://hooks.internal", "port"),
    ("0x7f000001", "four decimal numbers"),
    ("2130706433", "not an IP address or CIDR network"),
    ("127.1", "not an IP address or CIDR network"),
    ("[hooks.internal]:80", "brackets are for IPv6"),
    ("[::1", "not an IP address"),
    ("bad host", "not a valid host name"),
    ("a..b", "not a valid host name"),
    ("-a.example", "not a valid host name"),
    (":8080", "names no host"),
    ("bücher.example", "IDNA"),
])
def test_a_bad_allow_list_entry_is_a_config_error_naming_it(raw: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"PAL_EGRESS_ALLOW": f"10.0.0.0/8,{raw}"})
    message = str(info.value)
    assert f"PAL_EGRESS_ALLOW entry {raw!r}" in message and fragment in message
    assert "e.g. 127.0.0.1:8080" in message  # the message shows the syntax


def test_an_address_entry_allows_its_address_in_any_spelling_on_its_port_only() -> None:
    allow = parse_allow_list("127.0.0.1:8080")
    for spelling in ("127.0.0.1", "127.1", "2130706433", "0x7f000001", "::ffff:127.0.0.1"):
        host = host_of(spelling)
        assert decide(host, 8080, resolve(host, 8080, numeric_only=True), allow) is None, spelling
        assert (decide(host, 8081, resolve(host, 8081, numeric_only=True), allow) or "").startswith("loopback")
    assert decide("::1", 8080, [V6("::1")], allow) == "loopback"  # 127.0.0.1 is not ::1


def test_a_network_entry_allows_its_network_on_any_port() -> None:
    allow = parse_allow_list("10.0.0.0/8,fd00::/8")
    assert decide("svc.internal", 5000, [V4("10.20.30.40")], allow) is None
    assert decide("svc.internal", 5000, [V6("fd12::1")], allow) is None
    assert decide("svc.internal", 5000, [V4("10.0.0.1"), V4("192.168.0.1")], allow) == "private"
    assert decide("svc.internal", 5000, [V6("fe80::1")], allow) == "link-local"


def test_a_host_entry_allows_its_name_whatever_it_resolves_to() -> None:
    allow = parse_allow_list("hooks.internal:8443")
    assert decide("HOOKS.internal.", 8443, [V4("10.0.0.5"), V4("127.0.0.1")], allow) is None
    assert decide("hooks.internal", 443, [V4("10.0.0.5")], allow) == "private"
    assert decide("other.internal", 8443, [V4("10.0.0.5")], allow) == "private"


def test_localhost_can_be_allowed_by_name_or_by_address() -> None:
    for entries in (("localhost:8080",), ("127.0.0.1:8080", "[::1]:8080")):
        addresses = resolve("localhost", 8080)
        assert decide("localhost", 8080, addresses, parse_allow_list(entries)) is None, entries


# --- connector headers --------------------------------------------------------------------------------

def connector_graph(headers: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "start", "type": "trigger"},
                      {"id": "notify", "type": "connector",
                       "data": {"url": "https://hooks.example.com/x", "headers": headers}}],
            "edges": [{"source": "start", "target": "notify"}]}


@pytest.mark.parametrize("name", [*sorted(FORBIDDEN_HEADERS), "HOST", "Content-length", "Proxy-Authorization",
                                  "proxy-connection", "IDEMPOTENCY-KEY"])
def test_a_graph_cannot_set_routing_framing_or_hop_by_hop_headers(name: str) -> None:
    with pytest.raises(GraphError, match=f"header '{name}' is set by PAL, not by graphs"):
        parse_graph(connector_graph({name: "x"}))


@pytest.mark.parametrize(("headers", "fragment"), [
    ({"X-A\r\nHost": "x"}, "is not an HTTP field name"),
    ({"X A": "x"}, "is not an HTTP field name"),
    ({"X-A:": "x"}, "is not an HTTP field name"),
    ({"X-A\0": "x"}, "is not an HTTP field name"),
    ({"X-A": "x\r\nHost: evil"}, "its value holds CR, LF, NUL"),
    ({"X-A": "x\nY"}, "its value holds CR, LF, NUL"),
    ({"X-A": "x\0"}, "its value holds CR, LF, NUL"),
    ({"X-A": "x\x01"}, "or another control character"),
])
def test_header_injection_is_refused_at_validation(headers: dict[str, str], fragment: str) -> None:
    with pytest.raises(GraphError, match=fragment):
        parse_graph(connector_graph(headers))


def test_ordinary_and_templated_headers_pass_validation() -> None:
    parse_graph(connector_graph({"X-Source": "pal", "Authorization": "Bearer {{ input.token }}",
                                 "X-Note": "{{ input.note }}"}))
    parse_graph(connector_graph("{{ input.headers }}"))  # checked after rendering instead
    assert header_problem("X-Note", "line one\r\nHost: evil") is not None  # ...by the same check


# --- email addresses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "ada@example.test, eve@evil.test", "ada@example.test,eve@evil.test", "ada@example.test;eve@evil.test",
    "ada@example.test; eve@evil.test", "ada@example.test eve@evil.test", "ada@example.test\r\nBcc: eve@evil.test",
    "ada@example.test\nBcc: eve@evil.test", "ada@example.test\0", "friends: ada@example.test, eve@evil.test;",
    "friends: ada@example.test;", "Ada <ada@example.test> <eve@evil.test>", "not an address", "ada@", "@example.test",
    "",
])
def test_an_email_item_that_is_not_exactly_one_address_is_refused(text: str) -> None:
    assert isinstance(one_address(text), str), text


@pytest.mark.parametrize(("text", "addr_spec"), [
    ("ada@example.test", "ada@example.test"), ("Ada Lovelace <ada@example.test>", "ada@example.test"),
    ('"Lovelace, Ada" <ada@example.test>', "ada@example.test"), ('"a,b"@example.test', '"a,b"@example.test'),
    ("<ada@example.test>", "ada@example.test"),
])
def test_one_address_per_item_is_accepted(text: str, addr_spec: str) -> None:
    address = one_address(text)
    assert not isinstance(address, str) and address.addr_spec == addr_spec
