"""Local cluster launcher (filled in below)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    del commands


__all__ = ["add_parser", "argparse"]
