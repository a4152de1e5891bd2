# Declarations for natsjs/_core/jsdeliver.pyx (nothing is cimported from it yet).
