"""The work of the root commands (``train.py``, ``eval.py``, ``predict.py``, ...): each module here
holds one command; the root script only parses its command line and reports errors in one line."""
