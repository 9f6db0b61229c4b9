"""A disk as slow, next to this machine's compute, as a Mac's SSD is next to a Mac's: reads of a
process throttled by the kernel (cgroup v1 `blkio.throttle.read_bps_device`, or v2 `io.max`;
root), for bench/squeezed_io.py --read-mbps.

Why: this VM computes a 12-layer token of the bench's Qwen3-30B-A3B shape in about 0.51 s
(mlx-lm resident, 1.86-1.99 tok/s: bench/README.md), some 65 times a 16 GB M4's time for the
same layers (bench/mac_projection.py's compute: 1.89 GB a 48-layer token at 60% of 120 GB/s plus
0.1 ms a layer, 31 ms; 7.8 ms for 12 layers), while its disk reads at over 1 GB/s: here every
engine's token is its compute, and the bytes an engine reads barely show. On the Mac the disk is
the token. Throttled to a Mac's SSD over that factor (3 and 9.5 GB/s, from
../shared/notes/prior-art.md: 46 and 146 MB/s here), a token's reads weigh against its compute
as they would there. Every read is throttled: page-cache misses, read-ahead and mapped faults
alike, as the kernel issues them for the process.
"""

from __future__ import annotations

import os
from pathlib import Path


def disk_of(path: Path) -> str:
    """`MAJOR:MINOR` of the whole disk `path` lies on (throttles name disks, not partitions)."""
    dev = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (sysfs / "partition").exists():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


def own_cgroup(controller: str) -> tuple[Path, bool]:
    """This process's cgroup folder for `controller` (memory, blkio) and whether it is cgroup v1's;
    on cgroup v2 the one unified folder, for every controller."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if line.split(":")[1] == controller]
    if v1:
        return Path(f"/sys/fs/cgroup/{controller}{v1[0]}"), True
    return Path("/sys/fs/cgroup" + next(ln.split(":", 2)[2] for ln in lines if ln[0] == "0")), False


def read_throttle(path: Path, bytes_per_s: int, group: Path) -> Path:
    """A cgroup whose processes read the disk under `path` at `bytes_per_s` at most: `group`
    itself on cgroup v2 (one hierarchy: the memory cgroup), else a fresh blkio group beside this
    process's own. The caller moves a process into it and removes it once that process has
    exited."""
    disk = disk_of(path)
    root, v1 = own_cgroup("blkio")
    if not v1:
        (group / "io.max").write_text(f"{disk} rbps={bytes_per_s}")
        return group
    blkio = root / group.name
    blkio.mkdir()
    (blkio / "blkio.throttle.read_bps_device").write_text(f"{disk} {bytes_per_s}")
    return blkio
