from __future__ import annotations

import math

import pytest
import torch

from src.ops.group_embedding import GroupEmbedding
from src.ops.relative_position import RelativePositionTable, relative_sinusoid


@pytest.fixture(autouse=True)
def one_thread():
    # at these tiny shapes waking a second thread costs more than it saves on a shared CPU
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_scaled_lookup_batch_first() -> None:
    emb = GroupEmbedding(11, 8)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 10]])
    x = emb(tokens)
    assert x.shape == (2, 3, 8)
    torch.testing.assert_close(x[1, 2], emb.weight[10] * math.sqrt(8))


def test_group_view_is_contiguous_blocks() -> None:
    emb = GroupEmbedding(5, 12)
    x = emb(torch.tensor([[3]]))
    grouped = x.unflatten(-1, (3, 4))  # (B, T, G, D/G)
    torch.testing.assert_close(grouped[0, 0, 1], emb.weight[3, 4:8] * math.sqrt(12))


def test_init_gives_unit_variance_and_parameter_count() -> None:
    torch.manual_seed(0)
    emb = GroupEmbedding(204, 256)
    assert sum(p.numel() for p in emb.parameters()) == 204 * 256  # word_emb in params.json
    assert abs(emb(torch.arange(204)).std().item() - 1.0) < 0.02


def test_embedding_gradcheck() -> None:
    emb = GroupEmbedding(5, 4).double()
    tokens = torch.tensor([[0, 3, 3], [4, 1, 0]])
    weight = emb.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda w: torch.func.functional_call(emb, {"weight": w}, (tokens,)), (weight,)
    )


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match=r"n_token \(0\) and d_model \(8\)"):
        GroupEmbedding(0, 8)


def test_relative_sinusoid_rows_are_distances_descending() -> None:
    table = relative_sinusoid(6, 8)
    assert table.shape == (6, 8)
    torch.testing.assert_close(table[-1], torch.cat([torch.zeros(4), torch.ones(4)]))
    inv_freq = 10000 ** (-torch.arange(0, 8, 2) / 8)
    torch.testing.assert_close(table[1], torch.cat([(4 * inv_freq).sin(), (4 * inv_freq).cos()]))
    with pytest.raises(ValueError, match="even"):
        relative_sinusoid(3, 5)


def test_position_table_reads_last_rows_and_learns() -> None:
    table = RelativePositionTable(16, 8)
    assert sum(p.numel() for p in table.parameters()) == 16 * 8
    torch.testing.assert_close(table(10).detach(), relative_sinusoid(10, 8))
    table(4).sum().backward()
    assert table.table.grad[:12].abs().sum() == 0 and table.table.grad[12:].abs().min() == 1
    with pytest.raises(ValueError, match=r"\[1, 16\].*got 17"):
        table(17)


def test_position_table_gradcheck() -> None:
    table = RelativePositionTable(5, 4).double()
    param = table.table.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda p: torch.func.functional_call(table, {"table": p}, (3,)), (param,)
    )
