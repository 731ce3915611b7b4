"""Parallel text from the gettext catalogues that installed Python packages ship.

A package translated with gettext keeps, per language, ``locale(s)/<lang>/LC_MESSAGES/<domain>.mo``:
every English message (``msgid``) with its human translation (``msgstr``). Django's German
catalogues hold about 900 user-interface strings ("Please go to the following page and choose a
new password:"); pycountry's hold about 4,000 names of languages, countries, scripts and
currencies ("Ancient Greek (to 1453)" / "Altgriechisch (bis 1453)"). Together they are a real
English-German corpus available offline wherever the packages are installed.

The compiled ``.mo`` files are read with the standard library's :class:`gettext.GNUTranslations`,
so fuzzy (unreviewed) entries are already left out by ``msgfmt``. Skipped as well: the header
(empty ``msgid``), untranslated entries, and entries whose translation is the message itself
(names kept as they are, e.g. most subdivision names, would teach only copying). A plural entry
gives its singular pair (``msgid``, ``msgstr[0]``); ``msgctxt`` contexts are dropped.
"""

from __future__ import annotations

import gettext
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

CONTEXT_SEPARATOR = "\x04"  # gettext stores "msgctxt\x04msgid" as the key of a message with context


@dataclass(frozen=True)
class CatalogueEntry:
    """One translated message: English ``source`` and its ``translation``, from ``origin``."""

    source: str
    translation: str
    origin: str


def read_catalogue(path: str | Path) -> list[CatalogueEntry]:
    """The translated messages of one ``.mo`` file, sorted by message."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            catalogue = gettext.GNUTranslations(file)._catalog
    except OSError as error:  # a truncated or foreign file
        raise ValueError(f"{path} is not a readable gettext catalogue: {error}") from error
    entries = []
    for key, translation in catalogue.items():
        if isinstance(key, tuple):  # (msgid, n): plural forms; keep the singular
            key, form = key
            if form != 0:
                continue
        source = key.rsplit(CONTEXT_SEPARATOR, 1)[-1]
        if source and translation and translation != source:
            entries.append(CatalogueEntry(source, translation, str(path)))
    return sorted(entries, key=lambda e: (e.source, e.translation))


def find_catalogues(language: str, roots: Iterable[str | Path] | None = None) -> list[Path]:
    """Every ``locale*/<language>/LC_MESSAGES/*.mo`` under ``roots`` (the installed packages'
    ``site-packages`` by default), sorted so the corpus is the same from run to run."""
    if roots is None:
        roots = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    found: set[Path] = set()
    for root in roots:
        found.update(Path(root).glob(f"**/locale*/{language}/LC_MESSAGES/*.mo"))
    return sorted(found)


def parallel_messages(language: str, roots: Iterable[str | Path] | None = None) -> Iterator[CatalogueEntry]:
    """The messages of every catalogue of ``language``, each (source, translation) pair once."""
    seen: set[tuple[str, str]] = set()
    for path in find_catalogues(language, roots):
        for entry in read_catalogue(path):
            key = (entry.source, entry.translation)
            if key not in seen:
                seen.add(key)
                yield entry
