"""The ring's hostfile: the JSON file MLX_HOSTFILE names, which mlx.launch and streamer launch
write for each rank of MLX's ring backend (the one started where there is no GPU), and MLX's ring
reads when the group is asked for. Read here once, guarded, for both of its readers: finding the
group (parallel/group.py) and counting the ranks that share this host's cores (cpu_cores.py)."""

from __future__ import annotations

import json
import os

from .files import read_bytes

HOSTFILE_BYTES = 16 << 20  # past any cluster's ring hostfile (cli/hostfile.py's MAX_BYTES)


def ring_hosts() -> list[set[str]] | None:
    """Each rank's IP addresses as the file MLX_HOSTFILE names lists them (`[["ip:port", ...],
    ...]`, rank i's at index i); [] where it lists none: mlx.launch's ring of one host writes ""
    there, which MLX's ring fails to parse, and MLX's ring divides by zero on `[]`. None where
    MLX_HOSTFILE is not set or its file is not the ring's (MLX's own error says what is wrong
    with it). Raises StreamerError for a FIFO or device there (MLX's ring waits on a FIFO
    forever), as io/files.py refuses one."""
    path = os.environ.get("MLX_HOSTFILE")
    if path is None:
        return None
    try:
        text = read_bytes(path, "MLX_HOSTFILE, the ring's hostfile", HOSTFILE_BYTES).strip()
        hosts = json.loads(text) if text else []
    except (OSError, ValueError):  # a missing file, or one cut at HOSTFILE_BYTES
        return None
    return [_ips(host) for host in hosts] if isinstance(hosts, list) else None


def _ips(host: object) -> set[str]:
    """The IP addresses of one rank's `"ip:port"` entries."""
    entries = host if isinstance(host, list) else []
    return {entry.rsplit(":", 1)[0] for entry in entries if isinstance(entry, str)}
