"""F.embedding and the embedding layers: forward against plain indexing, the scatter-add
backward against finite differences (repeated ids included), a planted wrong backward caught."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinymlp.functional as F
from tinymlp import GradcheckError, gradcheck, nn, tensor
from tinymlp.models import sinusoidal_embedding
from tinymlp.ops.embedding import Embedding

with_device = settings(
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture]
)
ID_SHAPES = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


def table(rng, V, D, device="cpu"):
    return tensor(rng.normal(size=(V, D)), requires_grad=True, dtype="float64", device=device)


@with_device
@given(V=st.integers(1, 6), D=st.integers(1, 4), shape=ID_SHAPES, seed=st.integers(0, 2**32 - 1))
def test_embedding_gradcheck(V, D, shape, seed, device):
    rng = np.random.default_rng(seed)
    E = table(rng, V, D, device)
    ids = rng.integers(0, V, size=shape)         # with V small, ids repeat: the add must accumulate
    out = F.embedding(E, ids)
    assert out.shape == (*shape, D)
    np.testing.assert_array_equal(out.numpy(), E.numpy()[ids])
    gradcheck(lambda w: F.embedding(w, ids), (E,))


def test_repeated_ids_accumulate():
    E = table(np.random.default_rng(0), 4, 2)
    ids = np.array([[1, 1, 3], [1, 0, 0]])
    F.embedding(E, ids).sum().backward()
    counts = np.bincount(ids.ravel(), minlength=4)[:, None]   # row 1 read 3 times, row 2 never
    np.testing.assert_array_equal(E.grad, np.broadcast_to(counts, (4, 2)))


class AssignBackward(Embedding):
    """The classic slip: grad[ids] = g (buffered assignment keeps one of the repeated rows)."""

    @staticmethod
    def backward(ctx, g):
        grad = np.zeros((ctx.num_embeddings,) + g.shape[-1:], dtype=g.dtype)
        grad[ctx.ids] = g
        return grad


def test_assignment_instead_of_scatter_add_is_caught():
    E = table(np.random.default_rng(1), 3, 2)
    ids = np.array([0, 2, 2, 1])
    gradcheck(lambda w: F.embedding(w, ids), (E,))                    # the control passes
    with pytest.raises(GradcheckError):
        gradcheck(lambda w: AssignBackward.apply(w, ids=ids), (E,))


def test_bad_ids_are_refused():
    E = table(np.random.default_rng(2), 3, 2)
    with pytest.raises(IndexError, match="embedding"):
        F.embedding(E, np.array([0, 3]))
    with pytest.raises(IndexError, match="embedding"):
        F.embedding(E, np.array([-1]))
    with pytest.raises(TypeError, match="integers"):
        F.embedding(E, np.array([0.0, 1.0]))


def test_layers_gradcheck():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 5, size=(2, 4))
    emb = nn.Embedding(5, 3, rng=0).to(dtype="float64")
    pos = nn.PositionEmbedding(4, 3, rng=1).to(dtype="float64")
    head = nn.TiedLMHead(emb).to(dtype="float64")
    head.bias.data[...] = rng.normal(size=5)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos, self.head = emb, pos, head

        def forward(self, ids):
            return self.head(self.pos(self.emb(ids)))

    lm = LM()
    assert sorted(n for n, _ in lm.named_parameters()) == ["emb.weight", "head.bias", "pos.weight"]
    gradcheck(lm, (ids,))
    logits = lm(ids).numpy()
    E, P = emb.weight.numpy(), pos.weight.numpy()
    np.testing.assert_allclose(logits, (E[ids] + P) @ E.T + head.bias.numpy(), rtol=1e-12)


def test_sinusoidal_position_is_a_fixed_buffer():
    pos = nn.PositionEmbedding(6, 4, table=sinusoidal_embedding(6, 4))
    assert list(pos.parameters()) == [] and "table" not in pos.state_dict()
    x = tensor(np.zeros((2, 5, 4), dtype=np.float32))
    np.testing.assert_allclose(pos(x).numpy()[1], sinusoidal_embedding(6, 4)[:5], rtol=1e-6)
    with pytest.raises(ValueError, match="PositionEmbedding"):
        pos(tensor(np.zeros((1, 7, 4), dtype=np.float32)))
