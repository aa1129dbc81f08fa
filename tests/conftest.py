"""Shared test configuration.

Hypothesis runs derandomized by default so the suite is deterministic; set
HYPOTHESIS_PROFILE=explore to draw fresh random examples (a failure prints the
steps and a @reproduce_failure blob to replay it).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
