"""A token dictionary laid out as fairseq's, so vocabulary sizes and ids match the official runs.

fairseq's ``Dictionary`` (which ``fairseq-preprocess`` writes as ``dict.<lang>.txt`` and the
official DeLighT models were trained with) puts four special symbols first, ``<s>`` = 0,
``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3, then the training corpus's tokens by descending
count (ties in alphabetical order), then pads the table with ``madeupword0000``, ... to a multiple
of 8 (``padding_factor``). The official IWSLT'14 De-En dictionaries so hold 8,848 (de) and 6,632
(en) entries.

The same table holds a vocabulary without specials (``specials=()``), as the official AWD-LSTM
``data.py`` builds it (:class:`~src.datamodules.word_corpus.Vocabulary`): ``<unk>``, when the
words include it, is then where the words put it, and a table without it refuses unknown words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from src.datamodules.text_files import DEFAULT_ENCODING, read_text
from src.utils.files import atomic_write_text

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
SPECIALS = (BOS, PAD, EOS, UNK)
BOS_ID, PAD_ID, EOS_ID, UNK_ID = range(4)
PADDING_FACTOR = 8


class Dictionary:
    """Symbols <-> ids; the specials first (fairseq's four: ids 0-3).

    Args:
        symbols: the table after the specials, in id order.
        specials: the symbols placed first; ``()`` for a table of the given symbols alone.
    """

    def __init__(self, symbols: Iterable[str], *, specials: Sequence[str] = SPECIALS) -> None:
        self.specials: tuple[str, ...] = tuple(specials)
        self.symbols: tuple[str, ...] = (*self.specials, *symbols)
        self.indices = {symbol: i for i, symbol in enumerate(self.symbols)}
        if len(self.indices) != len(self.symbols):
            repeated = [s for s, n in Counter(self.symbols).items() if n > 1][:5]
            raise ValueError(f"a dictionary lists each symbol once; repeated: {repeated}")
        self.unk_id: int | None = self.indices.get(UNK)
        # ids decode leaves out: the specials but <unk> (fairseq's bos, pad and eos)
        self._hidden = frozenset(i for i, s in enumerate(self.specials) if s != UNK)

    @classmethod
    def from_counts(
        cls, counts: Mapping[str, int], *, threshold: int = 0, padding_factor: int = PADDING_FACTOR
    ) -> Dictionary:
        """fairseq's ``Dictionary.finalize``: symbols counted at least ``threshold`` times (0 keeps
        all; the specials are placed first whatever their count), by descending count, ties in
        string order, then ``madeupword0000``, ... up to a multiple of ``padding_factor``."""
        ranked = sorted(
            (s for s, n in counts.items() if n >= threshold and s not in SPECIALS),
            key=lambda s: (-counts[s], s),
        )
        filler = (-(len(SPECIALS) + len(ranked))) % padding_factor
        return cls([*ranked, *(f"madeupword{i:04d}" for i in range(filler))])

    @classmethod
    def build(
        cls, lines: Iterable[str], *, threshold: int = 0, padding_factor: int = PADDING_FACTOR
    ) -> Dictionary:
        """fairseq-preprocess's dictionary of the whitespace tokens of ``lines``."""
        counts: Counter[str] = Counter()
        for line in lines:
            counts.update(line.split())
        return cls.from_counts(counts, threshold=threshold, padding_factor=padding_factor)

    @classmethod
    def load(cls, path: str | Path, encoding: str = DEFAULT_ENCODING) -> Dictionary:
        """A fairseq ``dict.<lang>.txt`` in ``encoding``: one ``<symbol> <count>`` line per entry
        after the specials (which the file does not list)."""
        path = Path(path)
        symbols = []
        for number, line in enumerate(read_text(path, encoding).splitlines(), start=1):
            symbol, _, count = line.rstrip().rpartition(" ")
            if not symbol or not count.lstrip("-").isdigit():
                raise ValueError(f"{path}:{number}: expected '<symbol> <count>', got {line!r}")
            symbols.append(symbol)
        return cls(symbols)

    def save(self, path: str | Path, counts: Mapping[str, int] | None = None) -> None:
        """Write the table after the specials in fairseq's ``dict.txt`` form, ``<symbol> <count>``
        (0 where ``counts`` has none), via a temporary file and an atomic rename."""
        counts = counts or {}
        path = Path(path)
        words = self.symbols[len(self.specials) :]
        text = "".join(f"{symbol} {counts.get(symbol, 0)}\n" for symbol in words)
        atomic_write_text(path, text)

    def __len__(self) -> int:
        return len(self.symbols)

    def index(self, symbol: str) -> int:
        """The id of ``symbol``; ``<unk>``'s when it is not in the table (``KeyError`` for a table
        without ``<unk>``)."""
        found = self.indices.get(symbol, self.unk_id)
        if found is None:
            raise KeyError(f"{symbol!r} is not in the vocabulary, which has no {UNK}")
        return found

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens`` (``<unk>`` for unknown ones), without eos."""
        return [self.index(token) for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Symbols of ``ids``, leaving out the specials but ``<unk>`` (bos, pad and eos)."""
        return [self.symbols[i] for i in ids if i not in self._hidden]
