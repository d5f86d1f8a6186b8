"""Build hook for the optional native parts: the replay core (`alloctune.sim._native`), the
pickle screen's token run (`alloctune.trace._screen`) and the OOM message templates' matcher
(`alloctune.diagnose._templates`).

Everything else is declared in pyproject.toml. The extension is `optional`: where no C
compiler is available the install still succeeds and the simulator uses its pure-Python
model (and says so once), the pickle screen and the message templates their regular expressions. Wheels for Linux/macOS/Windows are built by cibuildwheel
(see `[tool.cibuildwheel]` and .github/workflows/wheels.yml), so users need no compiler.
"""

import sys

from setuptools import Extension, setup

_ARGS = [] if sys.platform == "win32" else ["-O3"]

setup(
    ext_modules=[
        Extension(
            "alloctune.sim._native",
            sources=["src/alloctune/sim/_native.c"],
            extra_compile_args=_ARGS,
            optional=True,
        ),
        Extension(
            "alloctune.diagnose._templates",
            sources=["src/alloctune/diagnose/_templates.c"],
            extra_compile_args=_ARGS,
            optional=True,
        ),
        Extension(
            "alloctune.trace._screen",
            sources=["src/alloctune/trace/_screen.c"],
            extra_compile_args=_ARGS,
            optional=True,
        ),
    ]
)
