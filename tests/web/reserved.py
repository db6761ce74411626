"""Reserved IPv6 addresses in every spelling a resolver or a URL could give them.

Shared by the web tests (webfetch and the egress proxy on the host) and the
conformance suite (the same rule, reached from a sandbox). The ranges are the
IANA IPv6 special-purpose registry's, the rest of the space outside global
unicast (2000::/3), and the IPv6 forms that embed a non-public IPv4 address.
"""

from __future__ import annotations

import ipaddress

from hypothesis import strategies as st

#: Networks whose every address must be refused, whatever it embeds.
RESERVED_V6 = (
    "::/128",
    "::1/128",
    "::/96",  # IPv4-compatible
    "::ffff:0:0:0/96",  # IPv4-translated (SIIT)
    "64:ff9b:1::/48",  # local-use NAT64
    "100::/64",  # discard-only
    "2001::/32",  # Teredo
    "2001:2::/48",  # benchmarking
    "2001::/23",  # IETF protocol assignments
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "2001:10::/28",  # ORCHID
    "2001:20::/28",  # ORCHIDv2
    "5f00::/16",  # SRv6 SIDs
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local
    "ff00::/8",  # multicast
    "4000::/2",  # reserved by the IETF (outside 2000::/3)
    "8000::/1",
)
#: IPv4 networks a call must not reach inside an IPv4-mapped, NAT64 or 6to4 address.
PRIVATE_V4 = (
    "127.0.0.0/8",
    "10.0.0.0/8",
    "169.254.0.0/16",
    "192.168.0.0/16",
    "172.16.0.0/12",
    "100.64.0.0/10",
    "0.0.0.0/8",
)
#: Where each embedding puts the IPv4 address: (prefix, shift of the 32 bits).
_EMBEDDINGS = (("::ffff:0:0", 0), ("64:ff9b::", 0), ("2002::", 80))

#: A spelling of each kind, for the conformance suite (one call tries them all).
SAMPLES = (
    "::ffff:0:127.0.0.1",
    "0:0:0:0:ffff:0:7f00:1",
    "::FFFF:0:A9FE:A9FE",
    "::ffff:127.0.0.1",
    "0000:0000:0000:0000:0000:ffff:0a00:0001",
    "64:ff9b::127.0.0.1",
    "64:ff9b:1::a00:1",
    "2002:7f00:1::1",
    "::127.0.0.1",
    "::1",
    "0::0001",
    "100::1",
    "2001::1",
    "2001:2::1",
    "2001:db8::1",
    "3fff::1",
    "5f00::1",
    "fd00::1",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "4000::1",
)


def _address(draw: st.DrawFn) -> ipaddress.IPv6Address:
    if draw(st.booleans()):
        net = ipaddress.IPv6Network(draw(st.sampled_from(RESERVED_V6)))
        offset = draw(st.integers(0, net.num_addresses - 1))
        return net[offset]
    v4net = ipaddress.IPv4Network(draw(st.sampled_from(PRIVATE_V4)))
    v4 = int(v4net[draw(st.integers(0, v4net.num_addresses - 1))])
    prefix, shift = draw(st.sampled_from(_EMBEDDINGS))
    rest = draw(st.integers(0, (1 << 80) - 1)) if shift else 0
    return ipaddress.IPv6Address(int(ipaddress.IPv6Address(prefix)) | (v4 << shift) | rest)


@st.composite
def reserved_spellings(draw: st.DrawFn) -> str:
    """A reserved IPv6 address, spelled with any padding, case, :: and dotted tail."""
    address = _address(draw)
    groups = [(int(address) >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    words = [format(g, "x").rjust(draw(st.integers(len(format(g, "x")), 4)), "0") for g in groups]
    if draw(st.booleans()):  # the last 32 bits as a dotted IPv4 address
        words[6:] = [str(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))]
    hex_words = len(words) if len(words) == 8 else 6
    zeros = [i for i in range(hex_words) if groups[i] == 0]
    if zeros and draw(st.booleans()):  # one run of zero groups written as ::
        first = last = draw(st.sampled_from(zeros))
        while last + 1 in zeros and draw(st.booleans()):
            last += 1
        text = ":".join(words[:first]) + "::" + ":".join(words[last + 1 :])
    else:
        text = ":".join(words)
    text = text.upper() if draw(st.booleans()) else text
    assert ipaddress.IPv6Address(text) == address, (text, address)
    return text
