"""natsjs: a NATS-compatible messaging server (trio for I/O, Cython for the hot path)."""

__version__ = "0.1.0"

# The NATS feature level advertised in INFO ``version``: clients gate features on it
# (nats-py uses the 2.9+ consumer-create API only when version >= 2.9).
NATS_VERSION = "2.12.0"
