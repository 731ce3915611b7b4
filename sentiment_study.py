"""Tables and curves of the DeLighT Scale x Shift sentiment study from its runs' directories.

The command line only; what it does is :mod:`src.commands.sentiment_study`."""

from src.commands.sentiment_study import main

if __name__ == "__main__":
    main()
