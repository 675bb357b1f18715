"""The README's examples run as written: each Python block of the newcomer sections is
executed, in order, in a folder holding the data they name (Parquet written by pandas,
tar shards by webdataset's TarWriter, an HF `save_to_disk` folder, an S3 bucket on moto
for the mixture), and the planner command runs. The complete examples of docs/ run too;
README stays a user's document (at most 400 lines, the test command CI runs), and every
relative link of README and docs/ leads to a file and a heading that exist."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from tests.conftest import S3

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
HOW_IT_WORKS = DOCS / "how-it-works.md"
FENCE = re.compile(r"^ *```")
HEADING = re.compile(r"^(#{1,6}) (.*)$")


def prose(text: str) -> list[str]:
    """The lines of a Markdown text outside its fenced code blocks, the fences blanked (a
    `# comment` in a code block is no heading)."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else line)
    return out


def blocks(heading: str, lang: str = "python", path: Path = README) -> list[str]:
    """The code blocks of `lang` in the section of `path` (README, or a file of docs/)
    under `heading` (to the next heading of any level)."""
    text = path.read_text()
    lines, outside = text.splitlines(keepends=True), prose(text)
    start = outside.index(heading) + 1
    stop = next((i for i in range(start, len(lines)) if HEADING.match(outside[i])), len(lines))
    section = "".join(lines[start:stop])
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def _parquet(path: Path, n: int, first: int, rng: np.random.Generator) -> None:
    import pandas as pd

    lengths = rng.integers(1, 20, n)
    pd.DataFrame(
        {
            "input_ids": [rng.integers(1, 1000, k).tolist() for k in lengths],
            "label": rng.integers(0, 2, n),
            "id": np.arange(first, first + n),
        }
    ).to_parquet(path, row_group_size=100)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rng = np.random.default_rng(0)
    for folder, shards in (("data/train", 4), ("data/code", 2)):
        (tmp_path / folder).mkdir(parents=True)
        for k in range(shards):
            _parquet(tmp_path / folder / f"part-{k}.parquet", 300, 300 * k, rng)
    _parquet(tmp_path / "data/a.parquet", 50, 0, rng)
    _parquet(tmp_path / "data/b.parquet", 50, 50, rng)
    (tmp_path / "shards").mkdir()
    for k in range(10):
        with wds.TarWriter(str(tmp_path / f"shards/train-{k:06d}.tar")) as sink:
            for i in range(8):
                buf = io.BytesIO()
                Image.fromarray(np.full((12, 10, 3), i * 20, np.uint8)).save(buf, format="JPEG")
                sink.write({"__key__": f"s{k}_{i}", "jpg": buf.getvalue(), "cls": i % 2})
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    hf = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(64)], "label": [0, 1] * 32})
    hf.save_to_disk(str(tmp_path / "my_dataset"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# what an example's reader has from the sections before it
PRELUDE = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "from shardstream import StreamingDataset\n"
)


def run(code: str, env: dict[str, object] | None = None) -> dict[str, object]:
    scope: dict[str, object] = {"__name__": "__readme__", **(env or {})}
    exec(compile(code, str(README), "exec"), scope)
    return scope


def test_the_training_loop_runs(workdir: Path) -> None:
    (code,) = blocks("## A training loop")
    scope = run(code)
    loss = float(scope["loss"].detach())  # type: ignore[attr-defined]
    assert loss == loss and loss > 0  # trained on real batches: a number, not NaN


def test_the_local_experiments_recipe_runs(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """The filter, the split and the batch formats, against pyarrow.dataset's filter of the
    files the recipe wrote."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as pads

    (code,) = blocks("### Local experiments")
    scope = run(PRELUDE + code)
    good = scope["good"]
    want = pads.dataset("data/exp").to_table(filter=good)
    assert want.num_rows == 249  # the even ids above 500
    train, val = scope["train"], scope["val"]
    batches = list(train)  # type: ignore[call-overload]
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert len(batches) == len(train) and scope["rows"] == train.sampler.num_records  # type: ignore[arg-type, attr-defined]
    frames = list(val)  # type: ignore[call-overload]
    assert all(isinstance(f, pd.DataFrame) for f in frames)
    ids = [i for b in batches for i in b["id"].to_pylist()] + [
        i for f in frames for i in f["id"].tolist()
    ]
    assert sorted(ids) == sorted(want["id"].to_pylist())  # disjoint, covering
    assert abs(len(pd.concat(frames)) - 25) <= 4  # a tenth, within a record a shard
    printed = capsys.readouterr().out
    assert printed.startswith("[{'id': ") and "'lang': 'en'" in printed


def test_the_tar_recipes_run(workdir: Path) -> None:
    first, second = blocks("### WebDataset tar shards")
    scope = run(PRELUDE + first)
    batch = scope["batch"]
    assert tuple(batch["jpg"].shape) == (64, 3, 12, 10)  # type: ignore[index]
    scope = run(PRELUDE + second)
    got = list(scope["loader"])  # type: ignore[call-overload]
    assert all(tuple(b["image"].shape[1:]) == (3, 32, 32) for b in got)
    assert sum(len(b["label"]) for b in got) == 80  # a worker's last batch may be short


LIGHTNING_FIT = """
class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.head, self.seen = torch.nn.Linear(1, 1), []

    def on_train_epoch_start(self):
        self.seen.append([])

    def training_step(self, batch, batch_idx):
        self.seen[-1].extend(batch["id"].tolist())
        return self.head(batch["label"].float()[:, None]).sum() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


model = Model()
data = Data()
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, callbacks=[SetEpoch(data)],
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, datamodule=data)
"""


def test_the_lightning_recipe_gives_each_epoch_its_order(workdir: Path) -> None:
    # the recipe's DataModule and callback in a real Trainer (one CPU process; the DDP runs
    # are in tests/test_process_group.py): every record each epoch, a new order each
    (code,) = blocks("### PyTorch Lightning")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*without set_epoch")
        scope = run(PRELUDE + code + LIGHTNING_FIT)
    epochs = scope["model"].seen  # type: ignore[attr-defined]
    assert len(epochs) == 3 and all(sorted(e) == list(range(1200)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_the_hf_recipe_runs(workdir: Path) -> None:
    (code,) = blocks("### Hugging Face datasets")
    scope = run(PRELUDE + code)
    assert sorted(r["text"] for r in scope["ds"]) == sorted(f"t{i}" for i in range(64))  # type: ignore[attr-defined]


def test_the_mixture_recipe_runs(workdir: Path, s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = s3.fs()
    fs.mkdir("bucket")
    fs.put(str(workdir / "data/train"), "bucket/web", recursive=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)  # the standard AWS variable
    (code,) = blocks("### Mixing sources")
    scope = run(code)
    ds: Any = scope["ds"]
    assert len(ds) == 1_000_000 // 16  # batches of blocks, one rank
    assert ds.sampler.epoch_phases().lengths == (900_000, 100_000)
    assert list(ds.sampler.epoch_phases().counts[1]) == [30_000, 70_000]  # web, code
    batch = next(iter(ds))
    assert batch["input_ids"].shape == (16, 2049) and batch["__stream__"].shape == (16,)


def test_the_resume_recipe_resumes(workdir: Path) -> None:
    """One process (torchrun's is tests/test_resume_recipe.py): 3 epochs of 5 batches,
    a checkpoint every 2 steps; a second run resumes at step 14, in epoch 2."""
    (code,) = blocks("### Resume after a failure")
    assert "every = 100" in code
    code = code.replace("every = 100", "every = 2")
    scope = run(PRELUDE + code)
    assert scope["step"] == 15
    assert (workdir / "ckpt/latest").read_text() == "ckpt/step14"
    scope = run(PRELUDE + code)  # a second run starts from the checkpoint
    assert scope["start"] == 2 and scope["step"] == 15  # the one batch after step 14


def test_the_planner_command_runs(workdir: Path) -> None:
    (code,) = blocks("### Planning a job", "bash")
    r = subprocess.run(
        code,
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stderr
    assert "over 8 ranks x 4 workers" in r.stdout


def test_the_shard_sampler_example_of_how_it_works_runs() -> None:
    """docs/how-it-works.md, "The samplers": the import and the ShardSampler example."""
    imports, example, _mixture = blocks("## The samplers", path=HOW_IT_WORKS)
    scope = run(imports + example)
    assert scope["state"] == {"epoch": 2, "position": 1313}  # as its comment says
    assert sum(len(chunk.rows) for chunk in scope["plan"].chunks()) > 0  # type: ignore[attr-defined]


def test_the_readme_is_a_users_document() -> None:
    assert len(README.read_text().splitlines()) <= 400
    text = README.read_text()
    for name in ("reference", "how-it-works", "writing", "benchmarks", "development"):
        assert f"](docs/{name}.md)" in text, name  # linked from README
        first, *rest = (DOCS / f"{name}.md").read_text().splitlines()
        assert first.startswith("# ") and not [
            h for h in prose("\n".join(rest)) if h.startswith("# ")
        ]


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """.ci/run runs exactly the README's test command: byte for byte."""
    (command,) = re.findall(r"^exec (.+)$", (REPO / ".ci/run").read_text(), flags=re.M)
    shown = [
        line.split("  #")[0].rstrip()
        for block in blocks("## Install", "bash")
        for line in block.splitlines()
    ]
    assert command in shown
    assert "bash scripts/demo.sh" in shown  # and the main job on generated data


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(path.read_text()):
        if m := HEADING.match(line):
            s = slug(m.group(2))
            seen[s] = seen.get(s, -1) + 1
            if seen[s]:
                seen[f"{s}-{seen[s]}"] = 0  # GitHub numbers repeated headings
    return set(seen)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_leads_somewhere() -> None:
    files = [README, *sorted(DOCS.glob("*.md"))]
    assert len(files) >= 5
    checked = 0
    for path in files:
        for target in LINK.findall("\n".join(prose(path.read_text()))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https://, mailto: ...
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.name}: {target}: no such file"
            if anchor:
                assert dest.suffix == ".md", f"{path.name}: {target}"
                assert anchor in anchors(dest), f"{path.name}: {target}: no such heading"
            checked += 1
    assert checked >= 20


def test_the_pretraining_recipe_writes_tokens_and_packs_them(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer.json of the user's (here a word-level one trained on the spot: the tests
    reach no hub) and JSON Lines of text: the recipe's module tokenizes them in the writer's
    2 processes into token shards laid out for 8 x 2 readers, which it then packs."""
    import json

    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from shardstream.loader.read.amplification import job_amplification

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words, int(rng.integers(5, 200)))) for _ in range(12_000)]
    (workdir / "data/text").mkdir()
    for f in range(3):
        with open(workdir / f"data/text/part-{f}.jsonl", "w") as out:
            out.writelines(json.dumps({"text": t}) + "\n" for t in texts[f * 4000 : (f + 1) * 4000])
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[EOS]", "[UNK]"]))
    tok.save(str(workdir / "tokenizer.json"))
    module, code = blocks("### Pretraining on tokens")
    assert module.startswith("# tokenize_docs.py")
    (workdir / "tokenize_docs.py").write_text(module)
    monkeypatch.syspath_prepend(str(workdir))
    scope = run(PRELUDE + code)
    shards = sorted((workdir / "data/tokens").glob("*.parquet"))
    assert shards and pq.ParquetFile(shards[0]).metadata.num_row_groups > 1
    tokens = sum(len(t.split()) + 1 for t in texts)  # each document's words and its eos
    assert scope["steps"] == -(-(tokens // 129) // 8)
    assert tuple(scope["tokens"].shape)[1] == 129 and scope["tokens"].dtype == torch.int64  # type: ignore[attr-defined]
    ds = scope["ds"]
    assert "tokens:input_ids" in ds.index.table.column_names  # type: ignore[attr-defined]
    first = ds.stats()["pack"]  # type: ignore[attr-defined]
    assert first["tokens"] == tokens and first["blocks_per_rank"] == tokens // 129
    from shardstream import StreamingDataset

    job = StreamingDataset("data/tokens/", num_replicas=8, rank=0).sampler
    assert job_amplification(ds.index, job, 2, 1)[0] <= 1.1  # type: ignore[attr-defined,index]
