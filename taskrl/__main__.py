"""``python -m taskrl``: the ``taskrl`` command line (same as the installed console script)."""

from taskrl.cli import main

if __name__ == "__main__":
    main()
