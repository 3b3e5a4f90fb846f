"""bench/memory_growth.py runs end to end: a gateway with the memory hook answers a short load and
reports, before it and after it, what it keeps alive once its caches are cleared."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_script_reports_before_and_after_a_load() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "memory_growth.py"), "--windows", "1",
                           "--seconds", "1", "--clients", "2", "--policy", "coding-agent"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s*\d+\s+\d", line)]
    assert len(rows) == 2
    (before, *_), (after, *_) = rows
    assert before == "0" and int(after) > 0  # requests answered in the window
    for row in rows:
        rss, cleared, pymalloc = map(float, row[1:4])
        assert rss > 50 and cleared > 50 and pymalloc > 10  # a real process's figures
        assert int(row[5]) == 1  # the upstream client's message memo was found and cleared
    assert int(rows[1][6]) > 0 and int(rows[1][7]) > 0  # the node ids and messages seen it held, cleared
    assert int(rows[1][9]) > 0  # and the recent assemblies
