"""Format and lint (../shared/STYLE.md, pyproject's [tool.ruff]): `ruff format` at 100 columns and
`ruff check` (pycodestyle, pyflakes) pass on the whole repository. ruff is pinned in the dev
extra so that a newer formatter cannot fail a clean clone."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return [exe]


@pytest.mark.parametrize(
    "args", [["format", "--check", "."], ["check", "."]], ids=["format", "check"]
)
def test_ruff(args):
    run = subprocess.run(_ruff() + args, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
