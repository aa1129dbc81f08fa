"""The raftcoord command line (:mod:`.main`), the demo (:mod:`.demo`) and the
transaction tools (:mod:`.txn`)."""

from raftcoord.cli.main import main

__all__ = ["main"]
