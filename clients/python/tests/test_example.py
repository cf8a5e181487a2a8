"""The example agent loop runs end to end against the real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agent_loop.py"


def test_agent_loop_example(server: str) -> None:
    run = subprocess.run(
        [sys.executable, EXAMPLE, "--address", server],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert out.startswith("session ")
    assert [int(n) for n in re.findall(r"^\[task (\d+)\]", out, re.M)] == [1, 2, 3, 4]
    # Both triggers fire: nearing the budget, and the engine having dropped turns to fit.
    assert "compaction (over 70% of the budget)" in out
    assert "compaction (old turns had to be dropped to fit)" in out
    assert "rejected" not in out
    done = re.search(r"^done: 4 tasks, \d+ model calls, (\d+) summaries applied", out, re.M)
    assert done and int(done.group(1)) >= 2, out
    # Every rendered context stayed within the history budget.
    for used, budget in re.findall(r"context: (\d+) of (\d+) tokens", out):
        assert int(used) <= int(budget)
