"""step_rows.c against the torch code it replaces, bit for bit: the tied embedding's rows read
from the int8 table (Int8Embedding.reference) and the greedy argmax (torch.argmax: the first of
equal maxima, a NaN above every number)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.cpu import native, qmatmul as q4
from engine.layers.int8_embedding import Int8Embedding
from engine.sampling.sampler import _argmax

pytestmark = pytest.mark.skipif(q4.library() is None, reason="no C compiler or no AVX2/FMA/F16C here")


def _table(vocab: int, hidden: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (vocab, hidden), generator=g, dtype=torch.int8)
    d = torch.rand(vocab, hidden // 32, generator=g) * 0.02 + 1e-4
    return q4.pack_int8(q, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_rows_are_the_references_bits(dtype):
    vocab = 40 * q4.rows_per_group()
    codes, scales = _table(vocab, 96)
    embed = Int8Embedding(codes, scales, dtype)
    ids = torch.tensor([0, 1, vocab - 1, 17, 17, vocab // 2 + 3, 5])

    rows = embed(ids)

    assert rows.dtype == dtype and rows.shape == (7, 96)
    assert torch.equal(rows, embed.reference(ids))
    assert torch.equal(embed(ids[:0]), embed.reference(ids[:0]))


def test_an_id_outside_the_table_is_refused_not_read():
    embed = Int8Embedding(*_table(2 * q4.rows_per_group(), 64), torch.float32)

    for bad in (2 * q4.rows_per_group(), -1):
        with pytest.raises(IndexError, match="outside the vocabulary"):
            embed(torch.tensor([3, bad]))


def _native_argmax(x: torch.Tensor, threads: int = 2) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=torch.long)
    native.library().pagoda_argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr(), threads)
    return out


@pytest.mark.parametrize("rows", [1, 3, 33])
@pytest.mark.parametrize("vocab", [7, 64, 129, 49152])
def test_argmax_is_torchs_first_maximum(rows, vocab):
    g = torch.Generator().manual_seed(rows * vocab)
    x = torch.randn(rows, vocab, generator=g)
    x[:, -1] = x.max(dim=1).values  # a tie at the end: the first wins
    if vocab > 100:
        x[0, 70] = x[0, 90] = 1e9  # a tie in one block, after the first
        x[-1, :] = float("-inf")  # nothing above -inf: index 0

    assert torch.equal(_native_argmax(x), torch.argmax(x, dim=1))
    assert torch.equal(_native_argmax(x, threads=1), torch.argmax(x, dim=1))


def test_argmax_takes_the_first_nan_and_the_first_of_equal_zeros():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")],
                      [-0.0, 0.0, -1.0, -2.0],
                      [0.0, -0.0, float("inf"), 2.0]])

    assert _native_argmax(x).tolist() == torch.argmax(x, dim=1).tolist() == [1, 0, 2]


def test_the_samplers_argmax_reads_rows_by_their_stride():
    wide = torch.randn(5, 300, generator=torch.Generator().manual_seed(3))
    view = wide[:, :256]  # rows 300 floats apart

    assert torch.equal(_argmax(view), torch.argmax(view, dim=1))
    assert torch.equal(_argmax(wide[:, 44:]), torch.argmax(wide[:, 44:], dim=1))
