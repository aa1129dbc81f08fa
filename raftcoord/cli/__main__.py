"""``python -m raftcoord.cli``: the same command line as ``raftcoord``."""

import sys

from raftcoord.cli.main import main

sys.exit(main())
