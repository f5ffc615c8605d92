"""The engine-core process's entry point, importable without the engine: the API process
names it as the target of the process it spawns; only the child imports the engine."""

from __future__ import annotations

from typing import Any


def run_engine_core(*args: Any) -> None:
    from tokenmill.engine.startup import StartupProfile

    profile = StartupProfile("engine-core")  # from the moment the process was created
    profile.mark("spawn")
    from tokenmill.engine.core_proc import run_engine_core as run

    profile.mark("imports")
    run(*args, profile=profile)
