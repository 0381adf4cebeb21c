"""Text sets: the official archive formats written small (never downloaded), the generated tasks
and the token loader."""

import dataclasses
import hashlib
import io
import tarfile
import urllib.error
import urllib.request
import zipfile

import numpy as np
import pytest

from tinymlp.data import (
    SST2, TEXT_ARCHIVES, DatasetError, MaskedLMLoader, OrderTask, PairLookupTask, SentencePolarity, TokenLoader,
    get_text_dataset,
)
from tinymlp.data.tokenizer import Tokenizer

POS = ["a gorgeous , witty film .", "the best of the year .", "warm and funny ."]
NEG = ["dull , dull , dull .", "a mess from start to finish .", "it never finds its footing .",
       "simply bad ."]


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise urllib.error.URLError("network disabled by the test")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def polarity_archive(folder):
    """rt-polaritydata.tar.gz as shipped: Latin-1 lines in rt-polaritydata/, a README beside."""
    path = folder / "rt-polaritydata.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, lines in (("rt-polarity.pos", POS), ("rt-polarity.neg", NEG),
                            ("../rt-polaritydata.README.1.0.txt", ["readme"])):
            raw = ("\n".join(lines) + "\n").encode("latin-1")
            info = tarfile.TarInfo(f"rt-polaritydata/{name}".replace("rt-polaritydata/../", ""))
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def sst2_archive(folder):
    path = folder / "SST-2.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("SST-2/train.tsv", "sentence\tlabel\n" + "".join(
            f"{s} \t{y}\n" for s, y in [(POS[0], 1), (NEG[0], 0), (NEG[1], 0)]))
        zf.writestr("SST-2/dev.tsv", "sentence\tlabel\nhide new secretions \t0\n")
        zf.writestr("SST-2/test.tsv", "index\tsentence\n0\tuh huh\n")
    return path


def use(monkeypatch, key, archive, **changes):
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    spec = TEXT_ARCHIVES[key]
    files = {name: None for name in spec.files}        # the tiny copies are shorter than the real ones
    changes = {"urls": (archive.as_uri(),), "md5": md5, "files": files, **changes}
    monkeypatch.setitem(TEXT_ARCHIVES, key, dataclasses.replace(spec, **changes))


def test_polarity_download_split_and_offline_reuse(tmp_path, monkeypatch):
    serve = tmp_path / "serve"
    serve.mkdir()
    use(monkeypatch, "polarity", polarity_archive(serve))
    root = tmp_path / "data"
    train = SentencePolarity(root=root, train=True, progress=False, test_fraction=0.34)
    test = SentencePolarity(root=root, train=False, download=False, test_fraction=0.34)
    assert sorted(train.texts + test.texts) == sorted(POS + NEG)
    assert len(test) == 1 + 1                                   # round(0.34 * 3) + round(0.34 * 4)
    for ds in (train, test):
        for text, label in zip(ds.texts, ds.labels):
            assert text in (POS if label == 1 else NEG)
    assert sorted(p.name for p in root.iterdir()) == ["rt-polaritydata", "rt-polaritydata.tar.gz"]


def test_sst2_reads_train_and_dev(tmp_path, monkeypatch, no_network):
    sst2_archive(tmp_path)                                      # already in the data folder
    use(monkeypatch, "sst2", tmp_path / "SST-2.zip")
    train, dev = SST2(root=tmp_path, download=False), SST2(root=tmp_path, train=False, download=False)
    assert train.texts == [POS[0], NEG[0], NEG[1]] and train.labels.tolist() == [1, 0, 0]
    assert dev.texts == ["hide new secretions"] and dev.labels.tolist() == [0]


def test_missing_offline_names_data_dir_and_synthetic(tmp_path, no_network):
    with pytest.raises(DatasetError, match="--data-dir") as err:
        SentencePolarity(root=tmp_path, download=False)
    assert "--dataset synthetic" in str(err.value)
    with pytest.raises(DatasetError, match="no network"):
        SST2(root=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []                       # nothing half-written


def test_wrong_checksum_and_wrong_line_count_are_refused(tmp_path, monkeypatch):
    serve = tmp_path / "serve"
    serve.mkdir()
    archive = sst2_archive(serve)
    use(monkeypatch, "sst2", archive, md5="0" * 32)
    with pytest.raises(DatasetError, match="MD5 mismatch"):
        SST2(root=tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()                       # nothing created, nothing half-written
    use(monkeypatch, "sst2", archive)
    monkeypatch.setitem(TEXT_ARCHIVES, "sst2", dataclasses.replace(
        TEXT_ARCHIVES["sst2"], files={"train.tsv": 67_350, "dev.tsv": 873}))
    with pytest.raises(DatasetError, match="4 lines, expected 67350"):
        SST2(root=tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()               # the bad download was removed


def test_zip_member_outside_the_folder_is_refused(tmp_path, monkeypatch):
    archive = tmp_path / "serve" / "SST-2.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../evil.txt", "x")
    use(monkeypatch, "sst2", archive)
    with pytest.raises(DatasetError, match="outside"):
        SST2(root=tmp_path / "d", progress=False)
    assert not (tmp_path / "evil.txt").exists()


def test_the_polarity_archive_without_md5_is_read_with_a_size_limit(tmp_path, monkeypatch):
    assert TEXT_ARCHIVES["polarity"].md5 is None and TEXT_ARCHIVES["polarity"].max_size == 8 << 20
    serve = tmp_path / "serve"
    serve.mkdir()
    archive = polarity_archive(serve)
    with open(archive, "ab") as f:                      # a server that sends far more than the archive
        f.write(b"\0" * 20_000)
    use(monkeypatch, "polarity", archive, md5=None, max_size=10_000)
    with pytest.raises(DatasetError, match=r"downloading sentence polarity v1\.0 from file:.* was stopped: it is "
                                           r"larger than 10,000 bytes.*nothing was kept"):
        SentencePolarity(root=tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()                       # nothing created, nothing half-written
    (tmp_path / "b").mkdir()                            # the same archive found in the data folder
    (tmp_path / "b" / archive.name).write_bytes(archive.read_bytes())
    with pytest.raises(DatasetError, match=r"rt-polaritydata\.tar\.gz was refused: it is 2\d,\d{3} bytes, more than "
                                           r"the 10,000 that sentence polarity v1\.0 can be"):
        SentencePolarity(root=tmp_path / "b", download=False)


def test_a_zip_with_too_many_members_or_bytes_is_refused(tmp_path, monkeypatch):
    archive = tmp_path / "serve" / "SST-2.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("SST-2/train.tsv", "sentence\tlabel\n" + "a fine film \t1\n" * 5000)   # 80 kB, deflates to little
        zf.writestr("SST-2/dev.tsv", "sentence\tlabel\n")
    use(monkeypatch, "sst2", archive, max_unpacked=50_000)
    with pytest.raises(DatasetError,
                       match=r"SST-2\.zip was refused: its members would unpack to more than 50,000 bytes"):
        SST2(root=tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()                       # nothing created, nothing half-written
    use(monkeypatch, "sst2", archive, max_members=1, max_unpacked=1 << 30)
    with pytest.raises(DatasetError, match=r"SST-2\.zip was refused: it holds more than 1 members"):
        SST2(root=tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()


def test_a_data_file_that_is_not_utf8_names_the_file_and_line(tmp_path, monkeypatch, no_network):
    archive = tmp_path / "SST-2.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("SST-2/train.tsv", b"sentence\tlabel\ngood \t1\nbad \xff\xfe \t0\n")
        zf.writestr("SST-2/dev.tsv", "sentence\tlabel\nfine \t1\n")
    use(monkeypatch, "sst2", archive)
    with pytest.raises(DatasetError, match=r"train\.tsv, line 3: the bytes are not UTF-8"):
        SST2(root=tmp_path, download=False)


def test_order_task_needs_word_order():
    ds = OrderTask(400, seq_words=10, seed=1)
    assert ds.labels.mean() == pytest.approx(0.5, abs=0.1)
    for text, label in zip(ds.texts, ds.labels):
        words = text.split()
        assert len(words) == 10 and words.count("red") == words.count("blue") == 1
        assert label == int(words.index("red") > words.index("blue"))
    assert OrderTask(5, seed=1).texts == OrderTask(5, seed=1).texts != OrderTask(5, seed=1, train=False).texts


def test_pair_task_labels_say_whether_a_word_is_shared():
    ds = get_text_dataset("pairs", num_examples=200, words_per_side=3, vocab=10)
    assert ds.labels.mean() == 0.5
    for a, b, label in zip(ds.texts, ds.pairs, ds.labels):
        assert len(set(a.split()) & set(b.split())) == label


def test_lookup_task_labels_are_the_place_of_the_word():
    ds = PairLookupTask(100, words=4, vocab=9, seed=3)
    assert ds.num_classes == 4 and set(ds.labels.tolist()) == {0, 1, 2, 3}
    for a, b, label in zip(ds.texts, ds.pairs, ds.labels):
        assert len(set(a.split())) == 4 and a.split()[label] == b


def test_token_loader_batches_the_encoded_set():
    ds = OrderTask(10, seq_words=4)
    tok = Tokenizer.train(ds.corpus(), vocab_size=100)
    tokens = ds.encode(tok, max_len=8)
    assert tokens.ids.shape == (10, 8) and tokens.ids[:, 0].tolist() == [tok.cls_id] * 10
    loader = TokenLoader(tokens, 4, shuffle=True, rng=0)
    batches = list(loader)
    assert len(loader) == len(batches) == 3 and batches[-1][0].shape == (2, 8)
    seen = np.concatenate([ids.numpy() for ids, _ in batches])
    assert sorted(map(tuple, seen)) == sorted(map(tuple, tokens.ids))


def test_encode_counts_the_examples_it_truncates():
    ds = PairLookupTask(50, words=5, vocab=9, seed=0)
    tok = Tokenizer.train(ds.corpus(), vocab_size=200)                 # every word one piece
    lengths = [len(tok.encode(a, b, None)[0]) for a, b in zip(ds.texts, ds.pairs)]
    assert set(lengths) == {9}                                         # [CLS] 5 [SEP] 1 [SEP]
    assert ds.encode(tok, max_len=9).truncated == 0
    assert ds.encode(tok, max_len=12).truncated == 0                   # padded rows are never cut
    cut = ds.encode(tok, max_len=8)
    assert cut.truncated == 50 and "50 truncated" in repr(cut)
    small = Tokenizer.train(ds.corpus(), vocab_size=40)                # words cut into pieces
    want = sum(len(small.encode(a, b, None)[0]) > 9 for a, b in zip(ds.texts, ds.pairs))
    assert want > 0 and ds.encode(small, max_len=9).truncated == want


def test_masked_lm_loader_hides_real_tokens_and_returns_them_in_order():
    ds = OrderTask(40, seq_words=6)
    tok = Tokenizer.train(ds.corpus(), vocab_size=100)
    tokens = ds.encode(tok, max_len=10)
    loader = MaskedLMLoader(tokens, 8, mask_prob=0.3, rng=0, fixed=True)
    first = [(x.numpy(), y.numpy()) for x, y in loader]
    for (masked, targets), b in zip(first, range(len(loader))):
        original = tokens.ids[b * 8:(b + 1) * 8]
        hidden = masked == tok.mask_id
        assert hidden.any() and (original[hidden] >= 5).all()          # never [PAD], [CLS] or [SEP]
        np.testing.assert_array_equal(targets, original[hidden])
        np.testing.assert_array_equal(masked[~hidden], original[~hidden])
    again = [(x.numpy(), y.numpy()) for x, y in loader]                  # fixed: the same masks
    assert all((a[0] == b[0]).all() for a, b in zip(first, again))
