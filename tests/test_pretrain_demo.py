"""scripts/pretrain_demo.py: the README's main job, and its resume."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "scripts" / "pretrain_demo.py"
EPOCH = re.compile(r"^epoch (\d): ([\d,]+) records .* loss ([\d.]+); (.*)$", re.M)


def run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(DEMO), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_default_run_two_ranks_two_epochs_exactly_once(tmp_path: Path) -> None:
    out = run("--checkpoint", str(tmp_path / "ckpt.pt"))
    epochs = EPOCH.findall(out)
    assert [e[0] for e in epochs] == ["0", "1"]
    for _, records, _, verdict in epochs:
        assert records == "16,000"
        assert verdict == "every one of the 16,000 records seen exactly once"
    assert (tmp_path / "ckpt.pt").exists()
    # each epoch says what share of the loop's time went to waiting for data
    assert len(re.findall(r"rank 0 waited for data \d+% of the time\)", out)) == 2


def test_stop_and_resume_gives_the_uninterrupted_run(tmp_path: Path) -> None:
    ckpt = ["--checkpoint", str(tmp_path / "ckpt.pt")]
    straight = EPOCH.findall(run(*ckpt))
    stopped = run(*ckpt, "--stop-after-steps", "45")
    assert "stopping after 45 steps (epoch 0, batch 45)" in stopped
    resumed = run(*ckpt, "--resume")
    assert "resumed at epoch 0, batch 45" in resumed
    after = EPOCH.findall(resumed)
    # the resumed run reads only what was left: 16,000 - 45 batches x 64 x 2 ranks
    assert after[0][1] == f"{16_000 - 45 * 64 * 2:,}"
    assert [a[3] for a in after] == [s[3] for s in straight]  # exactly once, across the stop
    assert [a[2] for a in after] == [s[2] for s in straight]  # and the same training
