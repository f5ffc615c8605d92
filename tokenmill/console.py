"""The rich Console of the commands' output (tables, progress on stdout)."""

from __future__ import annotations

from rich.console import Console


class OutputConsole(Console):
    """On a closed pipe (`tokenmill usage | head`) it raises BrokenPipeError, for the command
    to end as every command does (tokenmill/cli.py: quietly, exit 141), where rich's Console
    would exit 1 itself."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # what is printed from here on is dropped
        raise BrokenPipeError
