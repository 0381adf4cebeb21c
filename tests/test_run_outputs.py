"""What a training run prints when it starts and writes after every epoch: a model summary (the
input, the parameters of each block, the total) and metrics.csv (one line per epoch, beside
metrics.json)."""

import csv
import io
import json

import numpy as np
import pytest

from tinymlp import models
from tinymlp.train import History, summary
from test_examples import MIXER, SMOKE, TINY, assert_ok, run
from test_examples_text import CLS
from test_examples_text import TINY as TEXT


# ---------------------------------------------------------------------- the summary
@pytest.mark.parametrize("name,overrides,blocks,own", [
    ("mixer_cifar", {"depth": 3}, "MixerBlock", []),
    ("amlp_cifar", {"depth": 2}, "GMLPBlock", []),
    ("vit_b16", {"depth": 2, "dim": 48, "heads": 4, "mlp_dim": 96}, "ViTBlock", ["cls_token", "pos_embed"]),
    ("gmlp_text_split", {"depth": 2, "vocab_size": 300}, "GMLPBlock", []),
])
def test_the_summary_counts_every_block_and_adds_up_to_the_total(name, overrides, blocks, own):
    model = models.create(name, **overrides)
    lines = summary(model).splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    depth = overrides["depth"]
    for i, block in enumerate(model.blocks):
        row = rows[f"blocks.{i}"]
        assert row[1] == blocks and int(row[2].replace(",", "")) == block.num_parameters()
    assert sum(1 for key in rows if key.startswith("blocks.")) == depth
    total = int(rows["total"][1].replace(",", ""))
    assert total == model.num_parameters() == sum(int(r[2].replace(",", "")) for k, r in rows.items() if k != "total")
    assert all(rows[k][1] == "Parameter" for k in own)
    config = model.config
    if "image_size" in config:
        side = config["image_size"]
        assert f"input images (3, {side}, {side})" in lines[0] and f"of {config['dim']} channels" in lines[0]
    else:
        assert f"input {config['seq_len']} token ids" in lines[0]


def test_a_tied_weight_is_counted_once():
    model = models.create("gmlp_text_split", depth=1, vocab_size=200, lm_head=True, num_classes=0)
    text = summary(model)
    assert int(text.splitlines()[-1].split()[1].replace(",", "")) == model.num_parameters()


# ---------------------------------------------------------------------- metrics.csv
def test_history_to_csv_holds_what_to_dict_holds():
    h = History()
    h.append(epoch=1, train_loss=np.float32(2.0), train_acc=0.25, val_loss=None, val_acc=None, lr=1e-3,
             epoch_time=1.5, images_per_sec=np.float64(100.0), steps=np.int64(10), warmup_time=0.7)
    h.append(epoch=2, train_loss=1.0, train_acc=1 / 3, val_loss=1.1, val_acc=0.45, lr=5e-4,
             epoch_time=1.4, images_per_sec=110.0, steps=20)
    rows = list(csv.DictReader(io.StringIO(h.to_csv())))
    d = h.to_dict()
    assert list(rows[0]) == list(d) and len(rows) == 2
    for i, row in enumerate(rows):
        for name, values in d.items():
            assert (row[name] == "") if values[i] is None else float(row[name]) == values[i], (name, row[name])


@pytest.mark.parametrize("script,flags", [(MIXER, [*SMOKE, *TINY[MIXER]]),
                                          (CLS, ["--dataset", "synthetic", "--synthetic-size", "200", *TEXT])],
                         ids=["mixer", "text"])
@pytest.mark.slow
def test_a_run_prints_its_summary_and_writes_metrics_csv_every_epoch(tmp_path, script, flags):
    out = tmp_path / "run"
    result = run(script, *flags, "--epochs", "2", "--out", out, cwd=tmp_path)
    assert_ok(result)
    head = result.stdout.split("epoch 1/2")[0]          # printed before the first epoch
    assert "blocks.0" in head and "blocks.1" in head and "total" in head and " parameters" in head
    assert "input " in head
    history = json.loads((out / "metrics.json").read_text())["history"]
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [int(r["epoch"]) for r in rows] == history["epoch"] == [1, 2]
    assert [float(r["train_loss"]) for r in rows] == history["train_loss"]
    assert [float(r["val_acc"]) for r in rows] == history["val_acc"]
    assert "metrics.csv" in result.stdout.splitlines()[-1]           # named among the outputs
