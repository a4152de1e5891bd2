# Declarations for the fsync thread (see syncer.pyx).  Nothing here is cimported by
# other modules yet; the class is used from Python by natsjs/jetstream/engine.py.
