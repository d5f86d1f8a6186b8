"""SHIM (issue 26, remove once nothing imports it): `alloctune.runner` moved to `alloctune.run.runner`.

Kept only so files owned by other sessions still import unchanged; this name is the very
same module object as the new one (`sys.modules`), so attributes and monkeypatches agree.
"""

import sys

from alloctune.run.runner import __name__ as _moved  # noqa: F401 (imports the new module)

sys.modules[__name__] = sys.modules["alloctune.run.runner"]
