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
import importlib.util
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from src.utils.extras import require

CONTEXT_SEPARATOR = "\x04"  # gettext stores "msgctxt\x04msgid" as the key of a message with context
# the packages the embedded corpus is read from, searched wherever they are importable from too
# (``pip install --target``, PYTHONPATH, a user site), not only in the environment's site-packages
CATALOGUE_PACKAGES = ("django", "pycountry")


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


def default_roots() -> list[Path]:
    """The environment's ``site-packages`` and the folders of :data:`CATALOGUE_PACKAGES` wherever
    they are imported from."""
    roots = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    for name in CATALOGUE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:  # neither installed nor importable: the demos extra brings it
            require(name, "demos", "data=gettext_de_en (the catalogues of Django and pycountry)")
        if spec is not None and spec.submodule_search_locations:
            roots.update(Path(location) for location in spec.submodule_search_locations)
    return sorted(roots)


def find_catalogues(language: str, roots: Iterable[str | Path] | None = None) -> list[Path]:
    """Every ``locale*/<language>/LC_MESSAGES/*.mo`` under ``roots`` (:func:`default_roots` by
    default), each once, sorted so the corpus is the same from run to run."""
    found: set[Path] = set()
    for root in default_roots() if roots is None else roots:
        found.update(
            p.resolve() for p in Path(root).glob(f"**/locale*/{language}/LC_MESSAGES/*.mo")
        )
    return sorted(found)


def parallel_messages(
    language: str, roots: Iterable[str | Path] | None = None
) -> Iterator[CatalogueEntry]:
    """The messages of every catalogue of ``language``, each (source, translation) pair once."""
    seen: set[tuple[str, str]] = set()
    for path in find_catalogues(language, roots):
        for entry in read_catalogue(path):
            key = (entry.source, entry.translation)
            if key not in seen:
                seen.add(key)
                yield entry
