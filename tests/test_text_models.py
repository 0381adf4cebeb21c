"""gMLP and aMLP on text: gradients, the padding mask, segments, the causal and masked-LM heads,
the presets' parameter arithmetic, and two learning tests on the generated order task."""

import numpy as np
import pytest

from tinymlp import gradcheck, optim, tensor
from tinymlp.data import OrderTask, TokenLoader
from tinymlp.models.gmlp import GMLPBlock
from tinymlp.data.tokenizer import Tokenizer
from tinymlp.models import PAPER_PARAMETERS, PRESETS, config, create, num_parameters
from tinymlp.models.text_gmlp import TextGMLP
from tinymlp.train import fit

TEXT_PRESETS = [name for name, (cls, _) in PRESETS.items() if cls is TextGMLP]

TINY = dict(vocab_size=12, seq_len=6, dim=4, depth=1, ffn_dim=8)


def ids_batch():
    """[CLS] a a [SEP] b [SEP] and [CLS] a [SEP] [PAD] [PAD] [PAD]."""
    return np.array([[2, 5, 6, 3, 7, 3], [2, 8, 3, 0, 0, 0]])


@pytest.mark.parametrize("options", [
    dict(), dict(attn_dim=3), dict(pooling="cls", position="learned"),
    dict(attn_dim=2, sgu_variant="multiplicative", toeplitz="1d", position="sinusoidal"),
])
def test_classifier_gradcheck(options):
    model = TextGMLP(**TINY, num_classes=3, seed=1, **options).to(dtype="float64")
    model.head.weight.data[...] = np.random.default_rng(0).normal(size=model.head.weight.shape)
    gradcheck(model, (ids_batch(),))


def test_lm_head_gradcheck_with_tied_table():
    model = TextGMLP(**TINY, num_classes=0, attn_dim=2, lm_head=True, seed=2).to(dtype="float64")
    gradcheck(lambda ids: model.token_logits(ids, positions=np.array([1, 4, 7])), (ids_batch(),),
              params=dict(model.named_parameters()))


def test_mean_pooling_counts_only_real_tokens():
    model = TextGMLP(**TINY, num_classes=2, seed=3).to(dtype="float64")
    model.head.weight.data[...] = np.random.default_rng(1).normal(size=model.head.weight.shape)
    ids = ids_batch()
    h, mask = model.features(ids)
    assert mask.tolist() == (ids != 0).tolist()
    pooled = np.stack([h.numpy()[b][mask[b]].mean(axis=0) for b in range(2)])
    expected = pooled @ model.head.weight.numpy() + model.head.bias.numpy()
    np.testing.assert_allclose(model(ids).numpy(), expected, rtol=1e-10)


def test_segments_are_read_from_the_first_sep():
    model = TextGMLP(**TINY, num_classes=2, seed=4).to(dtype="float64")
    ids = ids_batch()
    given = np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(model(ids).numpy(), model(ids, segments=given).numpy())
    assert not np.allclose(model.features(ids)[0].numpy(), model.features(ids, segments=0 * given)[0].numpy())


def test_tiny_attention_ignores_padding_keys():
    block = GMLPBlock(6, 4, 8, attn_dim=3, rng=0).to(dtype="float64")
    rng = np.random.default_rng(5)
    h = rng.normal(size=(2, 6, 4))
    mask = ids_batch() != 0
    changed = h.copy()
    changed[~mask] = rng.normal(size=changed[~mask].shape)     # other values behind the padding
    a = block.attn(tensor(h, dtype="float64"), mask=mask).numpy()
    b = block.attn(tensor(changed, dtype="float64"), mask=mask).numpy()
    np.testing.assert_allclose(a[mask], b[mask], rtol=1e-12)


def test_causal_lm_looks_only_left():
    model = TextGMLP(**TINY, num_classes=0, attn_dim=2, causal=True, lm_head=True, seed=5)
    ids = np.array([[2, 5, 6, 7, 8, 9]])
    later = ids.copy()
    later[0, 4:] = [10, 11]
    a, b = model.token_logits(ids).numpy(), model.token_logits(later).numpy()
    np.testing.assert_allclose(a[0, :4], b[0, :4], rtol=1e-6)
    assert not np.allclose(a[0, 4:], b[0, 4:])


def test_language_model_forward_gives_the_rows_its_loss_needs():
    masked = TextGMLP(**TINY, num_classes=0, lm_head=True, seed=6)
    ids = np.array([[2, 4, 6, 3, 4, 3], [2, 8, 4, 0, 0, 0]])             # three [MASK] (id 4)
    full = masked.token_logits(ids).numpy().reshape(-1, 12)
    np.testing.assert_allclose(masked(ids).numpy(), full[[1, 4, 8]], rtol=1e-6)
    causal = TextGMLP(**TINY, num_classes=0, lm_head=True, causal=True, seed=6)
    assert causal(ids).shape == (12, 12)


def test_wrong_length_is_refused():
    model = TextGMLP(**TINY, num_classes=2)
    with pytest.raises(ValueError, match="seq_len=6"):
        model(np.zeros((1, 5), dtype=np.int64))


def test_the_text_presets_are_presets():
    assert len(TEXT_PRESETS) == 10 and "gmlp_text18" in TEXT_PRESETS
    model = create("gmlp_text_split", vocab_size=40, seq_len=8, dim=8, depth=1, ffn_dim=16)
    assert isinstance(model, TextGMLP) and model.config["sgu_variant"] == "split"


@pytest.mark.parametrize("name", TEXT_PRESETS)
def test_parameter_arithmetic_matches_a_built_model(name):
    small = dict(vocab_size=40, seq_len=8, dim=8, depth=2, ffn_dim=16)
    for extra in (dict(), dict(lm_head=True, num_classes=0, position="learned")):
        cls, kwargs = config(name, **small, **extra)
        assert cls(**kwargs).num_parameters() == num_parameters(name, **small, **extra)
    cls, kwargs = config(name, **small, lm_head=True)
    body = cls(**kwargs).num_parameters() - kwargs["dim"] * 2 - 2 - kwargs["vocab_size"]   # less both heads
    assert num_parameters(name, include_head=False, **small, lm_head=True) == body


def test_paper_counts():
    text = [name for name in PAPER_PARAMETERS if name in TEXT_PRESETS]
    assert len(text) == 3
    for name in text:
        millions, with_head = PAPER_PARAMETERS[name]
        ours = num_parameters(name, include_head=with_head) / 1e6
        assert ours == pytest.approx(millions, rel=0.015), name


@pytest.mark.parametrize("attn_dim", [None, 8])
@pytest.mark.slow
def test_gmlp_and_amlp_learn_the_order_task(attn_dim):
    """Both classes have the same words: only mixing tokens by position can separate them."""
    train, test = OrderTask(1000, seq_words=8, seed=0), OrderTask(300, seq_words=8, seed=0, train=False)
    tok = Tokenizer.train(train.corpus(), vocab_size=100)
    model = TextGMLP(len(tok), 10, dim=32, depth=2, ffn_dim=64, attn_dim=attn_dim, seed=0)
    opt = optim.AdamW(optim.param_groups(model, 0.01), lr=5e-3)
    history = fit(model, opt, TokenLoader(train.encode(tok, 10), 32, shuffle=True, rng=0),
                  TokenLoader(test.encode(tok, 10), 300), epochs=3, progress=False)
    assert history.val_acc[-1] > 0.85                           # chance: 0.5 (about 0.98 reached)
