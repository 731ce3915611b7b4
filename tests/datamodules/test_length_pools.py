"""LengthPoolSampler: every text once an epoch, batches of similar length in a random order, a new
order each epoch that a seed repeats; the text classification loaders use it when asked."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from src.datamodules.length_pools import LengthPoolSampler


def spreads(order: list[int], lengths: list[int], batch_size: int) -> list[int]:
    """Longest minus shortest length in each batch the loader cuts from ``order``."""
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in batches]


def test_each_index_once_in_batches_of_similar_length() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 64) for _ in range(1000)]
    torch.manual_seed(0)
    order = list(LengthPoolSampler(lengths, batch_size=32, pool=8))
    assert sorted(order) == list(range(1000))
    pooled = spreads(order, lengths, 32)
    shuffled = spreads(rng.sample(range(1000), 1000), lengths, 32)
    # a random batch of 32 spans nearly the whole range (about 60); a pooled one an eighth of it
    # (a pool of 8 batches sorted: 64 / 8)
    assert statistics.mean(shuffled) > 50
    assert statistics.mean(pooled) < 10
    # the padding a batch pays: its longest length times its size, summed, against the lengths
    padded = sum(max(lengths[j] for j in order[i : i + 32]) * len(order[i : i + 32])
                 for i in range(0, 1000, 32))  # fmt: skip
    assert padded < 1.2 * sum(lengths)


def test_the_smaller_batch_comes_last_and_the_order_changes_each_epoch() -> None:
    lengths = list(range(100))
    torch.manual_seed(1)
    sampler = LengthPoolSampler(lengths, batch_size=16, pool=7)  # one pool: every text
    first, second = list(sampler), list(sampler)
    assert first != second and sorted(first) == sorted(second) == lengths
    # 100 = 6 x 16 + 4: six batches of 16 consecutive lengths, then the short batch (96-99)
    for order in (first, second):
        assert spreads(order[:96], lengths, 16) == [15] * 6
        assert sorted(order[96:]) == [96, 97, 98, 99]
    torch.manual_seed(1)
    assert list(sampler) == first  # a seeded run repeats its orders
    with pytest.raises(ValueError, match="positive"):
        LengthPoolSampler(lengths, batch_size=0, pool=2)


def test_the_tweets_loader_pools_by_length_when_asked(tmp_path) -> None:
    from src.datamodules.text_classification import SentimentTweetsDataModule

    csv = tmp_path / "tweets.csv"
    rows = ["sentiment,text"]
    rng = random.Random(0)
    words = ["good", "bad", "fine", "day", "night", "happy", "sad", "ok"]
    for i in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        rows.append(f"{('negative', 'neutral', 'positive')[i % 3]},{text} {i}")
    csv.write_text("\n".join(rows) + "\n")
    data = SentimentTweetsDataModule(
        str(tmp_path / "root"), 3, vocab_size=100, csv_path=str(csv), batch_size=16,
        length_pool=4,
    )  # fmt: skip
    data.setup()
    loader = data.train_dataloader()
    assert isinstance(loader.sampler, LengthPoolSampler)
    pooled = [
        int((tokens != 1).sum(1).max() - (tokens != 1).sum(1).min()) for tokens, _, _ in loader
    ]
    plain = SentimentTweetsDataModule(
        str(tmp_path / "root"), 3, vocab_size=100, csv_path=str(csv), batch_size=16
    )
    plain.setup()
    spread = [
        int((t != 1).sum(1).max() - (t != 1).sum(1).min()) for t, _, _ in plain.train_dataloader()
    ]
    assert statistics.mean(pooled) < statistics.mean(spread) / 3
    # evaluation keeps the split's order
    assert data.val_dataloader().sampler.__class__.__name__ == "SequentialSampler"
