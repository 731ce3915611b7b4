"""The papers' claims, tested fairly: two models at equal parameters, each learning rate tuned.

The command line only; what it does is :mod:`src.commands.study`."""

from src.commands.study import main

if __name__ == "__main__":
    main()
