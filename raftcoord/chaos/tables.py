"""How the command lines print rich tables (the admin commands, workload,
chaos, demo and audit): as wide as the terminal allows on a terminal, and
into a file or a pipe as wide as the table's rows are, so that each row
stays on one line for grep, awk and diff (rich would wrap them at 80
columns). Imports rich only when it prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = ["print_unwrapped"]

#: A width no table's row reaches: where a table printed to a file is measured.
UNBOUNDED_WIDTH = 1 << 20


def print_unwrapped(console: Console, renderable: RenderableType) -> None:
    """Print ``renderable`` (a table) on ``console``; when the console is not
    a terminal, on a console of the same file as wide as its widest row."""
    from rich.console import Console

    if not console.is_terminal:  # measured at a width no row reaches
        width = Console(width=UNBOUNDED_WIDTH).measure(renderable).maximum
        console = Console(file=console.file, width=width)
    console.print(renderable)
