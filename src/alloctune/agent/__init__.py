"""The in-process agent (runs inside the user's command) and where its start-up file lives.

The agent itself is `bootstrap.py`, loaded in the child by `sitecustomize.py`; this package
only tells the runner where those files are. Importing it never imports torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parent
BOOTSTRAP = AGENT_DIR / "bootstrap.py"
SITECUSTOMIZE = AGENT_DIR / "sitecustomize.py"


def make_site_dir(target: Path) -> Path:
    """Create `target` holding only our `sitecustomize.py`: the folder to put first on PYTHONPATH."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SITECUSTOMIZE, target / "sitecustomize.py")
    return target
