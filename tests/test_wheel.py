"""The project as `pip install` installs it (deploy/README.md, step 1): its
wheel holds every file of its packages, and `raftcoord cluster up` and
`cluster down` work from it, with no checkout beside it.

The wheel is built from the checkout without downloading anything
(setuptools and wheel are development dependencies) and installed into a new
venv whose dependencies are this venv's, so nothing comes from a registry."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from raftcoord.cluster.launcher import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("raftcoord", "fsm", "pid_allocator", "marker_writer", "partition_log", "spark")


#: The commands' environment: no PYTHONPATH that could name the checkout.
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}

pytestmark = pytest.mark.slow


def run(command: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``command``'s result; its output is shown when it fails."""
    done = subprocess.run(
        command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


def tracked_files() -> list[str]:
    """The checkout's files (tracked, or new and not ignored)."""
    listed = run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], ROOT, 60
    ).stdout
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout (the build
    leaves build/ and *.egg-info where it runs)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    for name in tracked_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / name).read_bytes())
    dist = base / "dist"
    run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--wheel-dir", str(dist), str(source)),
        ],
        base,
        300,
    )
    [built] = dist.glob("raftcoord-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_packages(wheel: Path) -> None:
    packaged = set(zipfile.ZipFile(wheel).namelist())
    wanted = {name for name in tracked_files() if name.split("/", 1)[0] in PACKAGES}
    assert wanted - packaged == set()


def test_cluster_up_and_down_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The dependencies: this venv's site-packages, after the new venv's own
    # (a path in a .pth file is appended; the .pth files in it are not read,
    # so this checkout's editable install is not seen).
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    own = run([str(python), "-c", purelib], tmp_path, 60)
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    (Path(own.stdout.strip()) / "dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], tmp_path, 120)
    where = run([str(python), "-c", "import raftcoord; print(raftcoord.__file__)"], tmp_path, 60)
    assert Path(where.stdout.strip()).is_relative_to(env_dir)

    raftcoord = str(env_dir / "bin" / "raftcoord")
    cluster_dir = tmp_path / "cluster"
    options = ["--cluster-dir", str(cluster_dir)]
    try:
        up = run(  # in tmp_path: no checkout where the nodes start
            [
                *(raftcoord, "cluster", "up", "--coordinators", "1", "--shards", "1"),
                *("--partition-nodes", "1", "--timeout", "60", *options),
            ],
            tmp_path,
            180,
        )
        assert "leader" in up.stdout
        down = run([raftcoord, "cluster", "down", *options], tmp_path, 60)
        assert f"stopped the cluster in {cluster_dir}" in down.stdout
    finally:
        cluster = LocalCluster(cluster_dir)
        if cluster.state is not None:
            cluster.down(grace_s=3)
