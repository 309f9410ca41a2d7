"""What a local Ray instance that normkit starts exposes, read from the real instance's sockets.

Every TCP port the instance's processes listen on (found through /proc: the sockets in each
process's file descriptors, matched against /proc/net/tcp{,6}) is on loopback; and, as a second
lock, no port answers a caller without Ray's token (gRPC answers UNAUTHENTICATED on the service that
port serves, HTTP answers 401), also when RAY_AUTH_MODE=disabled is set in the environment
(see docs/scaling.md).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from normkit_lab.executors import ExecutorOptions
from normkit_lab.executors.ray import RayExecutor

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs normkit-lab[ray]"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.xdist_group("ray")]  # a local Ray instance (conftest.py)

# One method of each gRPC service a Ray process serves; each port serves one of them.
GRPC_METHODS = ("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", "/ray.rpc.NodeManagerService/GetNodeStats",
                "/ray.rpc.CoreWorkerService/GetCoreWorkerStats", "/ray.rpc.ObjectManagerService/Pull")


def _listening() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket in LISTEN state on this machine."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # per-word little endian
            found[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(hex_port, 16))
    return found


def _is_loopback(address: str) -> bool:
    """127.0.0.0/8 and ::1, also written as an IPv4-mapped IPv6 address (::ffff:127.0.0.1)."""
    return ipaddress.ip_address(_plain(address)).is_loopback


def _plain(address: str) -> str:
    """An IPv4-mapped IPv6 address as the IPv4 address a client dials."""
    ip = ipaddress.ip_address(address)
    return str(getattr(ip, "ipv4_mapped", None) or ip)


def _ray_listeners() -> list[tuple[str, str, int]]:
    """(process name, address, port) for every listening socket of Ray's processes and this driver."""
    ray_dir = str(Path(importlib.util.find_spec("ray").origin).parent)
    listening = _listening()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if int(entry.name) != os.getpid() and ray_dir not in command and not command.startswith("ray::"):
                continue
            inodes = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        for link in inodes:
            if link.startswith("socket:[") and int(link[8:-1]) in listening:
                out.append((command.split()[0], *listening[int(link[8:-1])]))
    return out


def _refuses_without_token(address: str, port: int) -> str:
    """How the port answers a caller without the token: 'grpc UNAUTHENTICATED', 'http 401', or what it did."""
    import grpc

    host = "127.0.0.1" if address in ("0.0.0.0", "::") else address
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        codes = set()
        for method in GRPC_METHODS:
            try:
                channel.unary_unary(method)(b"", timeout=5)
                codes.add("OK")
            except grpc.RpcError as exc:
                codes.add(exc.code().name)
    if "OK" in codes:
        return "grpc OK: answered without the token"
    if "UNAUTHENTICATED" in codes:
        return "grpc UNAUTHENTICATED"
    try:
        urllib.request.urlopen(f"http://{host}:{port}/", timeout=5)
    except urllib.error.HTTPError as exc:
        return f"http {exc.code}"
    except OSError as exc:
        return f"neither: {exc}"
    return "http 200: answered without the token"


@pytest.mark.parametrize("auth_mode", [None, "disabled"], ids=["default", "RAY_AUTH_MODE=disabled"])
def test_every_port_of_the_local_instance_is_loopback_and_refuses_callers_without_the_token(
        monkeypatch: pytest.MonkeyPatch, auth_mode: str | None) -> None:
    import ray

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if auth_mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", auth_mode)
    executor = RayExecutor(ExecutorOptions(kind="ray"))
    assert executor._connect()  # the local instance, started exactly as `--executor ray` starts it
    try:
        assert ray.get(ray.remote(lambda: 7).remote()) == 7  # the instance works with the token
        listeners = _ray_listeners()
        names = {name.rsplit("/", 1)[-1] for name, _, _ in listeners}
        assert {"gcs_server", "raylet"} <= names, listeners
        assert not any("dashboard" in name for name in names), listeners
        exposed = [(name, address, port) for name, address, port in listeners if not _is_loopback(address)]
        assert not exposed, listeners
        answers = {(name, address, port): _refuses_without_token(_plain(address), port)
                   for name, address, port in listeners}
        accepted = {k: v for k, v in answers.items() if v not in ("grpc UNAUTHENTICATED", "http 401")}
        assert not accepted, answers
    finally:
        ray.shutdown()
        executor._local_env.close()
    assert os.environ.get("RAY_AUTH_MODE") == auth_mode  # this process's settings are back as they were
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
