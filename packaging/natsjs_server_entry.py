"""Entry point of the single-file ``natsjs-server`` binary (see packaging/README.md).

The same as the ``natsjs-server`` console script (``natsjs.cli:main``).
"""
import sys

from natsjs.cli import main

if __name__ == "__main__":
    sys.exit(main())
