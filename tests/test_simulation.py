"""The deterministic simulation (tests/simulation.py): a bounded run of seeds,
exact replay, and planted bugs that its invariants must catch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simulation import BUGS, Stats, main, replay_command, run_seed

#: Seeds of the bounded run (about 4 s); ``python -m tests.simulation --seeds N`` runs more.
SEEDS = range(200)
#: A planted bug must be caught within this many seeds.
BUG_SEEDS = range(50)


def test_seeds_hold_every_invariant() -> None:
    total = Stats()
    for seed in SEEDS:
        result = run_seed(seed)
        assert result.ok, (
            f"seed {seed} failed at step {result.step}: {result.failure}\n"
            f"replay: {replay_command(seed, None)}"
        )
        assert result.stats is not None
        for name in Stats.COUNTERS:
            setattr(total, name, getattr(total, name) + getattr(result.stats, name))
    print(f"seeds {SEEDS.start}..{SEEDS.stop - 1}: {total}")
    # Every fault and every client behaviour actually happened.
    for name in Stats.COUNTERS:
        assert getattr(total, name) > 0, name


def test_a_seed_replays_exactly() -> None:
    first, again = run_seed(7), run_seed(7)
    assert first.stats is not None and first.stats.digest
    assert first.stats == again.stats


@pytest.mark.parametrize(
    ("bug", "symptom"),
    [
        ("replay_snapshot_entry", "diverged"),
        ("close_on_equal_epoch", "closes data of epoch"),
    ],
)
def test_a_planted_bug_is_caught(bug: str, symptom: str) -> None:
    for seed in BUG_SEEDS:
        result = run_seed(seed, BUGS[bug])
        if not result.ok:
            print(f"{bug}: caught by seed {seed}: {result.failure}")
            assert symptom in result.failure
            return
    pytest.fail(f"{bug} went unnoticed by seeds {BUG_SEEDS.start}..{BUG_SEEDS.stop - 1}")


def test_the_command_line_prints_a_replay_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "3", "--first", "5"]) == 0
    assert "3 seeds ok" in capsys.readouterr().out
    assert main(["--seeds", "50", "--bug", "close_on_equal_epoch"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    seed = int(out.split()[1])
    assert f"replay: python -m tests.simulation --seed {seed} --bug close_on_equal_epoch" in out
    assert main(["--seed", str(seed), "--bug", "close_on_equal_epoch"]) == 1
    assert out == capsys.readouterr().out


@pytest.mark.slow
def test_replay_does_not_depend_on_string_hashing() -> None:
    """Two processes with different hash seeds run a seed to the same log."""
    root = Path(__file__).resolve().parent.parent
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-m", "tests.simulation", "--seed", "11"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        outputs.append(done.stdout)
    assert "digest=" in outputs[0]
    assert outputs[0] == outputs[1]
