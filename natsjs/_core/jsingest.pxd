# Declarations for natsjs/_core/jsingest.pyx (nothing is cimported from it yet).
