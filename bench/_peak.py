"""This process's own peak resident memory.

`ru_maxrss` is not it: Linux carries the parent's high-water mark across fork and exec, so a
measuring child started from a large process (a pytest worker, a bench driver holding a model)
reports the parent's peak when that is larger. `VmHWM` in /proc/self/status belongs to the
child's own address space, which exec makes new."""

from __future__ import annotations

import resource
import sys


def peak_bytes() -> int:
    if sys.platform.startswith("linux"):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, the BSDs KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
