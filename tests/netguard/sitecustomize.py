"""The network guard of the offline tests (tests/server/test_offline.py).

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one: a subprocess started
with this folder on PYTHONPATH runs with every connection to an address outside this machine, and every name
lookup that would ask a DNS server, refused. Each attempt is also appended to the file named by
$REST_LSP_NETGUARD_LOG, so that code which catches the error and carries on is still caught.
"""

import errno
import ipaddress
import os
import socket

_LOG = os.environ.get("REST_LSP_NETGUARD_LOG")
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


def _is_local_host(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).split("%")[0]
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse(what: str):
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {what}\n")
    raise OSError(errno.ENETUNREACH, f"network access blocked by the rest-lsp offline test: {what}")


def _check_address(sock, address) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local_host(address[0]):
        _refuse(f"connect {address!r}")


_connect, _connect_ex, _sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto
_getaddrinfo = socket.getaddrinfo


def connect(self, address):
    _check_address(self, address)
    return _connect(self, address)


def connect_ex(self, address):
    _check_address(self, address)
    return _connect_ex(self, address)


def sendto(self, data, *args):
    _check_address(self, args[-1])
    return _sendto(self, data, *args)


def getaddrinfo(host, *args, **kwargs):
    if not _is_local_host(host):
        try:
            ipaddress.ip_address(str(host).split("%")[0])  # a literal address needs no lookup
        except ValueError:
            _refuse(f"name lookup {host!r}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
socket.socket.sendto = sendto
socket.getaddrinfo = getaddrinfo
