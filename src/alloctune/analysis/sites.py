"""Sites: where in the program an allocation was made, read from its Python stack.

A site is the user's line (the innermost frame outside torch, the standard library and
installed packages) together with the innermost library frame (`timm/models/convnext.py:88`),
because one user line (`out = model(x)`) allocates through many library lines and a user
acts on the line they wrote. Between the two lies the model's own code: the innermost frame
outside torch and the standard library (`transformers/models/bert/modeling_bert.py:350`, or
the user's own module), named with its class where the source file can be read
(`BertSelfAttention.forward`); `--group model` groups by it and `--group layer` also tells
repeated identical modules apart as layer k of N by their order in the step. An allocation with no
Python frames in a recording that kept
stacks was made by a thread with no Python code: autograd's backward engine.

`--group line|function|file|module` coarsens the user's side of the site only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from alloctune.trace.model import StackTable

GROUPS = ("line", "function", "file", "module", "model", "layer")
MODEL_GROUPS = ("model", "layer")
NO_FRAMES = "(no Python frames: autograd backward)"
NO_STACKS = "(recording has no stacks)"
SETUP_FRAMES = "(library code only)"

_LIB_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3")
_TORCH = re.compile(r"(^|/)torch/")


def is_library(filename: str) -> bool:
    """Whether a frame belongs to torch, the standard library or an installed package."""
    if not filename or filename.startswith("<"):
        return True  # <frozen importlib...>, <string>: not a line a user can edit
    f = filename.replace("\\", "/")
    return any(m in f for m in _LIB_MARKERS) or bool(_TORCH.search(f))


_STDLIB = re.compile(r"/lib(64)?/python3[^/]*/(?!site-packages/|dist-packages/)")


def is_model_code(filename: str) -> bool:
    """Whether a frame is the model's own code: neither torch nor the standard library (a model
    library such as transformers or timm, or the user's own modules)."""
    if not filename or filename.startswith("<"):
        return False
    f = filename.replace("\\", "/")
    return not _TORCH.search(f) and not _STDLIB.search(f)


_DEFS: dict[str, list[tuple[int, str | None]]] = {}  # file -> (def line, its class or None), in line order
MAX_SOURCE_BYTES = 4 << 20
MAX_SOURCE_FILES = 4096


def _read_defs(filename: str) -> list[tuple[int, str | None]]:
    """Every `def` of a source file with the class it is a method of (None: a function), read once.

    A recording names files by itself (hostile ones too): only a regular file of at most 4 MiB is read,
    and at most that many bytes whatever it claims to hold (a /proc file reports size 0)."""
    import os

    try:
        if not os.path.isfile(filename) or os.path.getsize(filename) > MAX_SOURCE_BYTES:
            return []
        with open(filename, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return []
    if len(data) > MAX_SOURCE_BYTES:
        return []
    out: list[tuple[int, str | None]] = []
    scopes: list[tuple[int, str, str]] = []  # (indent, "class" | "def", name), innermost last
    for number, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        stripped = raw.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(raw) - len(stripped)
        while scopes and scopes[-1][0] >= indent:
            scopes.pop()
        for kind, prefix in (("class", "class "), ("def", "def "), ("def", "async def ")):
            if stripped.startswith(prefix):
                name = stripped[len(prefix) :].split("(")[0].split(":")[0].strip()
                if kind == "def":
                    owner = scopes[-1] if scopes else None
                    out.append((number, owner[2] if owner is not None and owner[1] == "class" else None))
                scopes.append((indent, kind, name))
                break
    return out


def class_of(filename: str, line: int) -> str | None:
    """The class whose method holds `line` of `filename`, read from the source where it can be read
    (the machine that recorded; a file up to 4 MiB), else None."""
    import bisect

    if filename not in _DEFS:
        if len(_DEFS) >= MAX_SOURCE_FILES:
            _DEFS.clear()
        _DEFS[filename] = _read_defs(filename)
    defs = _DEFS[filename]
    k = bisect.bisect_right(defs, line, key=lambda d: d[0]) - 1
    if k < 0:
        return None
    name = defs[k][1]
    return name if name is not None and name.isidentifier() else None


def model_label(frame: tuple[str, int, str] | None) -> str | None:
    """How a model-code frame reads: `path:line (Class.function)` (the class where the source says it)."""
    if frame is None:
        return None
    cls = class_of(frame[0], frame[1])
    func = f"{cls}.{frame[2]}" if cls else frame[2]
    return f"{short_path(frame[0])}:{frame[1]} ({func})"


def short_path(filename: str) -> str:
    """A library path from its package on (`timm/models/convnext.py`); a user path as given."""
    f = filename.replace("\\", "/")
    for m in ("/site-packages/", "/dist-packages/"):
        k = f.rfind(m)
        if k >= 0:
            return f[k + len(m) :]
    hit = _TORCH.search(f)
    if hit:
        return f[hit.start() + (1 if f[hit.start()] == "/" else 0) :]
    return f


def module_name(filename: str) -> str:
    """The dotted module a file is (`timm.models.convnext`; a user script: its stem)."""
    p = short_path(filename)
    if p.endswith(".py"):
        p = p[:-3]
    p = p.lstrip("/")
    parts = [x for x in p.split("/") if x]
    if not parts:
        return filename
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    if not is_library(filename):
        return parts[-1]
    return ".".join(parts)


@dataclass(frozen=True)
class SiteInfo:
    """The user's frame and the innermost library frame of one stack (frame ids, -1: none)."""

    user: int
    library: int
    model: int  # the innermost model-code frame (`is_model_code`), -1: none
    optimizer: bool  # a frame in torch/optim: the optimizer made it
    construction: bool  # module construction / .to() / .cuda() / parameter init


_CONSTRUCT_FUNCS = frozenset(
    {
        "_apply",
        "to",
        "cuda",
        "__init__",
        "reset_parameters",
        "_load_from_state_dict",
        "load_state_dict",
        "register_buffer",
        "register_parameter",
        "from_config",
        "_init_weights",
        "init_weights",
        "post_init",
        "_materialize",
        "to_empty",
    }
)


def site_infos(table: StackTable) -> list[SiteInfo]:
    """One `SiteInfo` per stack of the table."""
    frames = table.frames
    lib = [is_library(f[0]) for f in frames]
    model = [is_model_code(f[0]) for f in frames]
    norm = [f[0].replace("\\", "/") for f in frames]
    out = []
    for st in table.stacks:
        user = next((fid for fid in st if not lib[fid]), -1)
        library = st[0] if st and lib[st[0]] else -1
        model_fid = next((fid for fid in st if model[fid]), -1)
        optimizer = any("torch/optim/" in norm[fid] for fid in st)
        construction = any(
            ("torch/nn/modules/module.py" in norm[fid] and frames[fid][2] in _CONSTRUCT_FUNCS)
            or "torch/nn/init.py" in norm[fid]
            or "torch/nn/parameter.py" in norm[fid]
            or (frames[fid][2] in _CONSTRUCT_FUNCS and lib[fid] and frames[fid][2] != "to")
            for fid in st
        )
        out.append(SiteInfo(user, library, model_fid, optimizer, construction))
    return out


def frame_label(frame: tuple[str, int, str], group: str) -> str:
    """How a user frame reads at a grouping level."""
    filename, line, func = frame
    if group == "line":
        return f"{short_path(filename)}:{line} ({func})"
    if group == "function":
        return f"{short_path(filename)}:{func}"
    if group == "file":
        return short_path(filename)
    return module_name(filename)


def library_label(frame: tuple[str, int, str] | None) -> str | None:
    if frame is None:
        return None
    return f"{short_path(frame[0])}:{frame[1]} ({frame[2]})"


def site_keys(table: StackTable | None, infos: Sequence[SiteInfo], group: str) -> tuple[list[str], list[str | None]]:
    """Per stack id: the site label (the user frame at `group` level) and the library frame beside it.

    A stack with no user frame (only library code: e.g. a lazily built CUDA context) is
    labelled by its innermost library frame instead.
    """
    if group not in GROUPS:
        raise ValueError(group)
    if table is None:
        return [], []
    labels: list[str] = []
    libs: list[str | None] = []
    for info in infos:
        lib = table.frames[info.library] if info.library >= 0 else None
        if group in MODEL_GROUPS and info.model >= 0:
            labels.append(model_label(table.frames[info.model]) or "")
        elif info.user >= 0:
            labels.append(frame_label(table.frames[info.user], "line" if group in MODEL_GROUPS else group))
        elif lib is not None:
            labels.append(f"{SETUP_FRAMES} {library_label(lib)}")
        else:
            labels.append(SETUP_FRAMES)
        libs.append(library_label(lib))
    return labels, libs
