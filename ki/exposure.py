"""Whether a server may listen where the settings say: the local-only conveniences that ship must not
reach beyond this machine.

Two of them would hand the service to anyone who can connect:

* the published `api.jwt.secret` (in `config.json` and `ApiSettings`): with HMAC tokens on, anyone who
  has read this repository signs a token of any subject, an administrator's too;
* `api.demo_mode`: the console's demo-user picker mints tokens without any sign-in.

The secret is compared after normalisation (Unicode NFKC, surrounding white space stripped): the published
default with a trailing space or newline (as a secret file often ends) is still the published default. Off
loopback a secret of our users' own must also be strong: at least 32 bytes and about 128 bits by its
characters' Shannon entropy (a short or repetitive secret is refused like the published one).

Both are fine on a loopback address (127.0.0.0/8, ::1, `localhost`), where `ki demo`, `make test` and
the benchmarks run. Anywhere else (`0.0.0.0`, a public address, a host name that could resolve to one)
the server refuses to start. The decision is `exposure_problem`, a pure function of the settings; every
command that starts a listening server asks it first (`ki serve` and each of its workers, `ki demo`,
`ki mcp` over HTTP).
"""

from __future__ import annotations

import ipaddress
import math
import unicodedata
from collections import Counter
from typing import Literal

from ki.errors import SettingsError
from ki.settings import JwtSettings, Settings

#: The secret that ships (the field's default, the same in config.json): public, so no secret at all.
PUBLISHED_JWT_SECRET: str = JwtSettings.model_fields["secret"].default
MIN_SECRET_BYTES = 32
MIN_SECRET_BITS = 128.0


def normalised_secret(secret: str) -> str:
    return unicodedata.normalize("NFKC", secret).strip()


def secret_bits(secret: str) -> float:
    """An estimate of a secret's strength: its length times the Shannon entropy of its characters."""
    if not secret:
        return 0.0
    counts = Counter(secret)
    per_char = -sum(n / len(secret) * math.log2(n / len(secret)) for n in counts.values())
    return per_char * len(secret)


def weak_secret(secret: str) -> str | None:
    """Why `secret` must not sign tokens off loopback (the published one, short, low entropy); None if fine."""
    given = normalised_secret(secret)
    if given == normalised_secret(PUBLISHED_JWT_SECRET):
        return "is the published default (anyone can sign tokens with it)"
    if len(given.encode()) < MIN_SECRET_BYTES:
        return f"is shorter than {MIN_SECRET_BYTES} bytes"
    if secret_bits(given) < MIN_SECRET_BITS:
        return f"has too little entropy (about {secret_bits(given):.0f} bits; at least {MIN_SECRET_BITS:.0f})"
    return None


Server = Literal["api", "mcp"]


def is_loopback(host: str) -> bool:
    """Only this machine can connect: `localhost`, 127.0.0.0/8, ::1 (also as ::ffff:127.x.x.x). An empty
    host binds every interface; any other name may resolve to anything, so neither is loopback."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def exposure_problem(settings: Settings, server: Server = "api") -> str | None:
    """Why `server` (the search API on `api.host`, or the MCP server on `mcp.host`) must not start with
    these settings, as one line naming the settings; None if it may."""
    host = settings.mcp.host if server == "mcp" else settings.api.host
    if is_loopback(host):
        return None
    where = f"{server}.host {host!r} is not a loopback address"
    api = settings.api
    if server == "api" and api.demo_mode:
        return (f"refusing to start: api.demo_mode (always on under `ki demo`) hands out tokens without sign-in "
                f"and {where}; switch api.demo_mode off or bind api.host to 127.0.0.1")  # fmt: skip
    weak = weak_secret(api.jwt.secret) if api.jwt.enabled else None
    if weak is not None:
        return (f"refusing to start: api.jwt.secret {weak} and {where}; set api.jwt.secret_file (or "
                f"KI_API__JWT__SECRET) to a secret of your own (e.g. `openssl rand -base64 48`), set "
                f"api.jwt.enabled false, or bind {server}.host to 127.0.0.1")  # fmt: skip
    return None


def refuse_exposure(settings: Settings, server: Server = "api") -> None:
    """Raise `SettingsError` (one line, exit code 2 from `ki`) if `exposure_problem` finds one."""
    problem = exposure_problem(settings, server)
    if problem is not None:
        raise SettingsError(problem)
