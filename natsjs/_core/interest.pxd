# Declarations for local interest counting and RS+/RS- lines (see interest.pyx).

cpdef list count_interest(dict rm, list subs, int delta)
cpdef bytearray interest_lines(list subs, dict rm, bytes prefix, int delta)
cpdef bytearray rm_lines(dict rm, bytes prefix, bint add)
