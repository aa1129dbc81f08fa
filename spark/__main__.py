"""``python -m spark`` or ``spark-submit spark/__main__.py``: the audit (see spark.audit)."""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (spark-submit): make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark.cli import main

if __name__ == "__main__":
    sys.exit(main())
