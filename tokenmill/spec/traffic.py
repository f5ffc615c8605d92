"""Records finished requests (prompt and output, as text and token ids) as JSONL, for training
a draft head on the traffic a deployment serves (`serve --record-traffic DIR`).

This stores user data: opt-in only, size-capped (recording stops at the cap; nothing is
overwritten), files readable by the server's user only. One line per completed request:
{"prompt": ..., "output": ..., "prompt_token_ids": [...], "output_token_ids": [...],
 "finish_reason": ..., "time": unix seconds}; files part-<start time>-<n>.jsonl of at most
16 MiB each.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PART_BYTES = 16 << 20


class TrafficRecorder:
    def __init__(self, directory: str | Path, max_bytes: int, decode) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.decode = decode  # token ids -> text
        self.written = 0
        self.stamp = time.strftime("%Y%m%dT%H%M%S")
        self.part = 0
        self.part_bytes = 0
        self.file = None
        self.full = False

    def record(self, prompt_ids: list[int], output_ids: list[int], finish_reason: str) -> None:
        if self.full:
            return
        line = json.dumps(
            {
                "prompt": self.decode(prompt_ids),
                "output": self.decode(output_ids),
                "prompt_token_ids": prompt_ids,
                "output_token_ids": output_ids,
                "finish_reason": finish_reason,
                "time": round(time.time(), 3),
            },
            ensure_ascii=False,
        ).encode()
        if self.written + len(line) + 1 > self.max_bytes:
            self.full = True
            logger.warning("traffic recording stopped: %d bytes cap reached", self.max_bytes)
            self.close()
            return
        if self.file is None or self.part_bytes + len(line) + 1 > PART_BYTES:
            self._next_part()
        assert self.file is not None
        self.file.write(line + b"\n")
        self.file.flush()
        self.written += len(line) + 1
        self.part_bytes += len(line) + 1

    def _next_part(self) -> None:
        self.close()
        self.part += 1
        path = self.directory / f"part-{self.stamp}-{self.part}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.file = os.fdopen(fd, "ab")
        self.part_bytes = 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
