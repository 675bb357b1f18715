"""scripts/pretrain_demo.py: the README's main job (packed blocks of a token mixture of two
sources in two phases, 3:1 over the epoch), its resume, and a rank killed mid-epoch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "scripts" / "pretrain_demo.py"
EPOCH = re.compile(
    r"^epoch (\d): ([\d,]+) tokens (\(.*?\) )?in .* loss ([\d.]+); ([\d,]+) tokens dropped; (.*)$",
    re.M,
)
ONCE = "every one of the 256,086 tokens trained once"


def run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(DEMO), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_default_run_two_ranks_two_epochs_of_the_mixture(tmp_path: Path) -> None:
    out = run("--checkpoint", str(tmp_path / "ckpt.pt"))
    epochs = EPOCH.findall(out)
    assert [e[0] for e in epochs] == ["0", "1"]
    for _, tokens, streams, _, dropped, verdict in epochs:
        assert tokens == "260,064"  # 2,016 blocks of 129
        assert streams == "(prose 195,048, code 65,016) "  # 3:1 in tokens
        assert dropped == "0" and verdict == ONCE
    # per rank: 756 blocks at 5:1, then an annealing 252 at 1:1
    phases = "rank 0's blocks phase 1: 630 prose, 126 code; phase 2: 126 prose, 126 code"
    assert out.count(phases) == 2
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
    assert [a[5] for a in after] == [s[5] for s in straight] == [ONCE, ONCE]
    assert [a[3] for a in after] == [s[3] for s in straight]  # and the same training


def _rank_pid(marker: str, local_rank: int) -> int | None:
    """The pid of the torchrun worker with LOCAL_RANK `local_rank` whose command line holds
    `marker` (read from /proc: a real process, killed from outside)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in cmdline and f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(entry.name)
    return None


def test_a_rank_killed_mid_epoch_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    cmd = [sys.executable, str(DEMO), "--checkpoint", str(ckpt), "--epochs", "1"]
    proc = subprocess.Popen(
        [*cmd, "--step-delay", "0.05"],  # ~6 s an epoch: the kill lands mid-epoch
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists():  # the first checkpoint: step 20 of 126
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint came"
            time.sleep(0.05)
        victim = _rank_pid(str(ckpt), 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)  # torchrun tears the group down: no hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "epoch 0:" not in out  # it died before the epoch ended
    resumed = run(*cmd[2:], "--resume")
    start = re.search(r"resumed at epoch 0, batch (\d+)", resumed)
    assert start is not None and int(start.group(1)) % 20 == 0 and int(start.group(1)) > 0
    (epoch,) = EPOCH.findall(resumed)
    assert epoch[5] == ONCE  # counting from the checkpoint: every token once


def test_cache_dir_serves_the_second_epoch_from_disk(tmp_path: Path, s3) -> None:  # type: ignore[no-untyped-def]
    """--data on S3 with --cache-dir: the second epoch's line says the node cache served
    all of rank 0's bytes."""
    import json

    sys.path.insert(0, str(REPO / "scripts"))
    from pretrain_demo import make_source

    make_source(tmp_path / "src", 4, 300, 1, 1)
    fs = s3.fs()
    fs.mkdir("demo")
    fs.put(str(tmp_path / "src") + "/", "demo/src/", recursive=True)
    out = run(
        "--data",
        "s3://demo/src",
        "--storage-options",
        json.dumps(s3.storage_options),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--checkpoint",
        str(tmp_path / "ckpt.pt"),
    )
    lines = re.findall(r"^epoch (\d): node cache served .* \((\d+)%\); it holds .*$", out, re.M)
    assert [e for e, _ in lines] == ["0", "1"], out
    assert lines[1][1] == "100", out
    assert len(EPOCH.findall(out)) == 2
