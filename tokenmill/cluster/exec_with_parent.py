"""`python -m tokenmill.cluster.exec_with_parent CMD...`: runs CMD (exec, same pid) so that
it is killed when the thread that started it dies (Linux: PR_SET_PDEATHSIG survives exec).
A Ray actor starts its `tokenmill serve` this way: a killed actor leaves no orphan server
holding its ports and memory (the server's engine core follows its own parent)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m tokenmill.cluster.exec_with_parent CMD [ARG...]")
    parent = os.getppid()
    # not Linux: the actor's stop() and Ray's cleanup remain
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        raise SystemExit(1)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
