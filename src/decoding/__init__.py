"""Decoding from trained networks: beam and greedy search for translation, sampling and word
completion for language models. Decoders read a network through its incremental interface and
import no task, so ``translate.py``, ``generate.py`` and validation share one implementation."""
