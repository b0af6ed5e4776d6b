"""The server's ports: whether another process listens on them, and a claim on them that lasts the
supervisor's life (Triton listens only once its models have loaded)."""

from __future__ import annotations

import errno
import socket


def taken(ports: list[tuple[str, str, int]]) -> list[str]:
    """The endpoints whose port another process listens on. Only EADDRINUSE counts: an address this
    host does not have, a privileged port, a name that does not resolve are the server's to report."""
    taken = []
    for name, host, port in ports:
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is no holder
                s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                taken.append(f"{name} {host}:{port}")
    return taken


CLAIM = "voxcpm-serving-port-"  # an abstract Unix socket's name: CLAIM<port>-<address>
_WILDCARDS = ("", "0.0.0.0", "::")


def _addresses(host: str) -> set[str]:
    """The addresses `host` names, as one spelling each ("*": every address, also for a name that does
    not resolve): localhost, 127.1 and 127.0.0.1 are one claim."""
    if host in _WILDCARDS:
        return {"*"}
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return {"*"}
    found = {info[4][0].split("%", 1)[0] for info in infos}
    return {"*"} if found & set(_WILDCARDS) else found or {"*"}


def _claimed(port: int) -> set[str]:
    """The addresses claimed on `port` (claim), from the kernel's list of Unix sockets."""
    head = f"@{CLAIM}{port}-"
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            return {name[len(head):] for line in f if (name := line.split()[-1]).startswith(head)}
    except OSError:
        return set()


def claim(ports: list[tuple[str, str, int]]) -> tuple[list[socket.socket], list[str]]:
    """Claim the server's ports for this supervisor's life: -> (the claims, held while they are open;
    the endpoints another supervisor claimed, with nothing claimed then). Triton listens only once its
    models have loaded: until then a second supervisor found the ports free, started a server of its
    own and took the first one's readiness for its own. A claim is an abstract Unix socket's name
    (port and address), which leaves no file and goes with the process however it ends. A port claimed
    on another address does not conflict, except where either address is a wildcard (checked once
    the claim is made: of two supervisors claiming at once, at least one sees the other)."""
    claims, held, names = [], [], set()
    for name, host, port in ports:
        for address in sorted(_addresses(host)):
            if (port, address) in names:  # one port listed twice (a companion's, say): one claim
                continue
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind(f"\0{CLAIM}{port}-{address}")
            except OSError:
                s.close()
                held.append(f"{name} {host}:{port} (another supervisor's server)")
                break
            claims.append(s)
            names.add((port, address))
            others = _claimed(port) - {a for p, a in names if p == port}
            if others and (address == "*" or "*" in others):
                held.append(f"{name} {host}:{port} (another supervisor's server, on {', '.join(sorted(others))})")
                break
    if held:
        for s in claims:
            s.close()
        return [], held
    return claims, []


def host_port(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def url(host: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # a wildcard: the loopback
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
