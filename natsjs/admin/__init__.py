"""``natsjs``: the administration command line for natsjs (and nats-server).

natscli's commands, flags and output, on nats-py, so that what the NATS documentation
shows for ``nats`` can be typed with ``natsjs`` in its place; plus ``natsjs cluster
up``, which runs a local JetStream cluster configured as the documentation configures
one.  The command tree lives in ``app``; each command family in its own module
(``stream``, ``consumer``, ``server``, ``account``, ``core``, ``bench``, ``kv``,
``objstore``, ``context``, ``localcluster``); formats in ``render``.
"""


def main(argv=None) -> int:
    from natsjs.admin.app import main as run
    return run(argv)
