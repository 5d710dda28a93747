"""``python -m hopfield``: the ``hopfield`` command (:func:`hopfield.cli.main`)."""

import sys

from hopfield.cli import main

if __name__ == "__main__":
    sys.exit(main())
