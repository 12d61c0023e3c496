"""Child processes that do not outlive their parent: a sweep's runs and the image-decoding workers.

On Linux a process can ask the kernel to signal it when its parent dies (``prctl(PR_SET_PDEATHSIG)``): a sweep
killed with SIGKILL, which cannot stop its runs itself, still stops them (SIGTERM: each writes a checkpoint and
stops, as after Ctrl-C), and decoding workers go with the preparation that started them. Elsewhere nothing is
asked, and a killed parent's children run on until they end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """Ask for ``sig`` when this process's parent dies; True where the system does that (Linux).

    ``parent``: the parent's pid as the parent saw it; if this process has already been handed to another (the
    parent died before the request), ``sig`` is sent at once. Safe to call between fork and exec (``preexec_fn``).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True
