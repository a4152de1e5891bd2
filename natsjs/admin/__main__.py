"""``python -m natsjs.admin``: the same as the ``natsjs`` command."""
import sys

from natsjs.admin import main

sys.exit(main())
