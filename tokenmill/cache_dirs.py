"""Where tokenmill keeps what it builds and measures: $TOKENMILL_CACHE, else ~/.cache/tokenmill
(kernels/, kv/, kld/, llama.cpp peers)."""

from __future__ import annotations

import os
from pathlib import Path

from tokenmill import envs


def cache_root() -> Path:
    return Path(envs.CACHE.get() or os.path.expanduser("~/.cache/tokenmill"))
