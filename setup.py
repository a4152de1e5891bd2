"""Build natsjs: the trio server in natsjs/ and the Cython hot path in natsjs/_core/.

Every ``natsjs/_core/*.pyx`` becomes an extension module.  ``NATSJS_PROFILE=1`` builds
them with Cython's profiling and line-tracing hooks (for flamegraphs with Cython frames);
a normal build leaves those hooks out so they cost nothing.
"""
import glob
import os

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError as exc:  # pragma: no cover - build requirement declared in pyproject
    raise SystemExit("natsjs needs Cython to build: pip install cython") from exc

PROFILE = os.environ.get("NATSJS_PROFILE") == "1"

directives = {
    "language_level": "3",
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
    "embedsignature": True,
}
macros = []
if PROFILE:
    directives.update(profile=True, linetrace=True, binding=True)
    macros.append(("CYTHON_TRACE", "1"))
    macros.append(("CYTHON_TRACE_NOGIL", "1"))

extensions = [
    Extension(
        path[:-4].replace(os.sep, "."),
        [path],
        define_macros=macros,
        extra_compile_args=["-O3"],
    )
    for path in sorted(glob.glob(os.path.join("natsjs", "_core", "*.pyx")))
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        include_path=["natsjs/_core"],
    ),
)
