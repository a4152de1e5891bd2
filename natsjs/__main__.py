"""``python -m natsjs``: the same as the ``natsjs-server`` command."""
import sys

from natsjs.cli import main

sys.exit(main())
