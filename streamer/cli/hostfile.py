"""`streamer launch --hostfile FILE`: the file checked before mlx.launch reads it. MLX's parser
(mlx 0.32.4, Hostfile.from_file) takes `[]` and `{"hosts": []}` (then runs nothing and exits 0),
and `"envs"` as a string or `"ssh"` as a number, which fail later as tracebacks."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from ..errors import StreamerError
from ..io.files import read_bytes
from ..io.json_file import parse_json
from ..io.sizes import size_text

FORMAT = (
    'mlx.launch reads a JSON list of hosts, or {"backend": ..., "envs": ["NAME=value"], '
    '"hosts": [...]}, each host {"ssh": "HOST", "ips": ["IP", ...]}'
)


# a hostfile of thousands of hosts is well under this; one past it is not read through (a file
# grown sparse to terabytes took hours, or the memory)
MAX_BYTES = 16 << 20

# MLX joins an address to its port as `::1:5000`, which it cannot parse
IPV6 = "an IPv6 address, which MLX's backends cannot connect to: give the host's IPv4 address."


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def option(words: list[str], name: str) -> str | None:
    """The value of mlx.launch's option `name` (`--name V` or `--name=V`, the last one given)
    among its words before `--`."""
    options = words[: words.index("--")] if "--" in words else words
    value = None
    for i, word in enumerate(options):
        if word == name and i + 1 < len(options):
            value = options[i + 1]
        if word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def hostfile_of(words: list[str]) -> Path | None:
    """The --hostfile among mlx.launch's options; -n refused beside it, which mlx.launch ignores
    there (a hostfile of one host and -n 2 ran one rank)."""
    path = option(words, "--hostfile")
    options = words[: words.index("--")] if "--" in words else words
    if path is not None and any(w.startswith(("-n", "--repeat-hosts")) for w in options):
        raise StreamerError(
            f"-n repeats the hosts of --hosts, not those of a hostfile, which lists the host of "
            f"every rank: drop -n, and list a host in {path} once per rank."
        )
    return None if path is None else Path(path)


def check_host_list(words: list[str]) -> list[str]:
    """The hosts of `--hosts a,b` among mlx.launch's options (its default: 127.0.0.1, this
    one); a name ssh would read as an option refused (mlx.launch quotes it for the shell, and
    ssh then took `-oProxyCommand=...` as one)."""
    hosts = (option(words, "--hosts") or "127.0.0.1").split(",")
    bad = [h for h in hosts if h.startswith("-")]
    if bad:
        raise StreamerError(
            f"--hosts names {bad[0]!r}, which ssh would read as an option: give host names."
        )
    for host in hosts:
        if host != host.strip():  # not an address to MLX: "the ring backend requires IPs"
            raise StreamerError(
                f"--hosts names {host!r}, with spaces: separate the hosts by commas alone "
                "(--hosts 10.0.0.1,10.0.0.2)."
            )
        if _is_ipv6(host):  # mlx.launch takes it as the ring's address too
            raise StreamerError(f"--hosts names {host!r}, {IPV6}")
    return hosts


def check_hostfile(path: Path, backend: str | None) -> list[str]:
    """The hosts' "ssh" names of a hostfile mlx.launch can run a group from, or one
    StreamerError saying what is wrong; `backend`: --backend's, if given."""

    def bad(problem: str) -> StreamerError:
        return StreamerError(f"hostfile {path}: {problem}; {FORMAT}.")

    try:
        raw = read_bytes(path, "a hostfile", MAX_BYTES + 1)
    except FileNotFoundError:
        raise StreamerError(f"hostfile {path} does not exist.") from None
    except OSError as e:
        raise StreamerError(f"cannot read hostfile {path}: {e.strerror or e}.") from None
    if len(raw) > MAX_BYTES:
        raise StreamerError(
            f"hostfile {path} holds over {size_text(MAX_BYTES)}, more than a hostfile of "
            "thousands of hosts: give the hostfile."
        )
    data = parse_json(raw, f"hostfile {path}", f"{FORMAT}.")
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list):
        raise bad('no list of hosts (a list, or an object\'s "hosts")')
    if not hosts:
        raise bad("the list of hosts is empty: a group needs at least one")
    if isinstance(data, dict):
        if not isinstance(data.get("backend", ""), str):
            raise bad(f'"backend" is {data["backend"]!r}, not a name such as "ring"')
        envs = data.get("envs", [])
        if not isinstance(envs, list) or not all(isinstance(e, str) for e in envs):
            raise bad(f'"envs" is {envs!r}, not a list of "NAME=value" strings')
    for rank, host in enumerate(hosts):
        check_host(host, f"host {rank}", bad)
    if isinstance(data, dict):
        backend = backend or data.get("backend")
    if (backend or _default_backend()) == "ring":
        for rank, host in enumerate(hosts):
            if not host.get("ips"):  # MLX said to give "IPs instead of hostnames"
                raise bad(f'host {rank} has no "ips": the ring backend reaches each host there')
    return [host["ssh"] for host in hosts]


def _default_backend() -> str:
    """mlx.launch's backend when neither --backend nor the hostfile names one."""
    import mlx.core as mx

    return "nccl" if mx.cuda.is_available() else "ring"


def check_host(host: object, name: str, bad) -> None:
    if not isinstance(host, dict):
        raise bad(f"{name} is {host!r}, not an object")
    ssh = host.get("ssh")
    if not isinstance(ssh, str) or not ssh:
        raise bad(f'{name}\'s "ssh" is {ssh!r}, not a host name to reach it by')
    if ssh.startswith("-"):
        raise bad(f'{name}\'s "ssh" is {ssh!r}, which ssh would read as an option')
    ips = host.get("ips", [])
    if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
        raise bad(f'{name}\'s "ips" is {ips!r}, not a list of addresses')
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise bad(f'{name}\'s "ips" holds {ip!r}, not an IP address') from None
        if _is_ipv6(ip):
            raise bad(f'{name}\'s "ips" holds {ip!r}, {IPV6.removesuffix(".")}')
    if not isinstance(host.get("rdma", []), list):
        raise bad(f'{name}\'s "rdma" is {host["rdma"]!r}, not a list of devices')
