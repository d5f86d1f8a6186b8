"""Render "set this allocator variable (and run this command)" for bash, PowerShell, cmd and Python.

Every recommendation alloctune makes ends in an environment variable the user has to set, and
users copy those lines into very different shells. Getting the quoting wrong is the most common
way a correct fix silently does nothing (an unquoted `[` globbing in bash, `,` becoming an array
in PowerShell, `&` splitting a cmd line), so the rules live here once, as small pure functions:

* `env_assignments(conf, torch=...)` decides *which* variables to set for a torch version / vendor;
* `render(assignments, shell, command=...)` writes them for one shell;
* `render_all(...)` writes them for all four.

Which variable is read (c10's allocator-config parser): `PYTORCH_CUDA_ALLOC_CONF` by every release;
`PYTORCH_ALLOC_CONF` only from 2.10 (as a fallback, the CUDA name wins when both are set). Setting
both to the same string is therefore always safe, and it is what we do when the version is unknown.
ROCm builds (hipified) read `PYTORCH_HIP_ALLOC_CONF`, newer ones fall back to it; Ascend's torch_npu
reads `PYTORCH_NPU_ALLOC_CONF`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from alloctune.errors import InputError

SHELLS: tuple[str, ...] = ("bash", "powershell", "cmd", "python")

CUDA_VAR = "PYTORCH_CUDA_ALLOC_CONF"
GENERIC_VAR = "PYTORCH_ALLOC_CONF"
HIP_VAR = "PYTORCH_HIP_ALLOC_CONF"
NPU_VAR = "PYTORCH_NPU_ALLOC_CONF"

# First release whose CUDA allocator reads PYTORCH_ALLOC_CONF (c10/core/AllocatorConfig.cpp).
GENERIC_VAR_SINCE: tuple[int, int] = (2, 10)

_SHELL_ALIASES = {
    "bash": "bash",
    "sh": "bash",
    "zsh": "bash",
    "posix": "bash",
    "powershell": "powershell",
    "pwsh": "powershell",
    "ps": "powershell",
    "cmd": "cmd",
    "bat": "cmd",
    "python": "python",
    "py": "python",
}


def parse_torch_version(torch: str | Sequence[int] | None) -> tuple[int, int] | None:
    """`"2.10.0+cu130"`, `"2.11"`, `(2, 9)` -> `(major, minor)`; `None` or unreadable -> `None`.

    Lenient on purpose: shell lines are still worth printing when the version is unknown
    (then both variable names are set)."""
    from alloctune.config.versions import parse_torch_version as parse
    from alloctune.errors import InputError

    if torch is None:
        return None
    try:
        return parse(torch if isinstance(torch, str) else tuple(torch))
    except InputError:
        return None


def env_assignments(conf: str, torch: str | Sequence[int] | None = None, *, vendor: str = "cuda") -> dict[str, str]:
    """The environment variables (name -> value) that make `torch` read allocator string `conf`.

    `torch=None` means "unknown version": both the CUDA name and the generic 2.10+ name are set,
    which is correct for every release. A known version before 2.10 gets only the CUDA name (the
    generic one would be ignored and only confuse a reader). `vendor="hip"` adds the hipified
    name, `vendor="npu"` gives torch_npu's own variable. Raises `InputError` for an empty string
    or one that cannot live in an environment variable.
    """
    conf = conf.strip()
    if not conf:
        raise InputError("empty allocator setting: nothing to put in PYTORCH_CUDA_ALLOC_CONF")
    if any(c in conf for c in "\n\r\0"):
        raise InputError(f"allocator setting {conf!r} contains a line break or NUL; write it on one line")
    vendor = vendor.lower()
    if vendor == "npu":
        return {NPU_VAR: conf}
    if vendor not in ("cuda", "hip"):
        raise InputError(f"vendor {vendor!r} has no PyTorch allocator-config variable (only cuda, hip and npu do)")
    version = parse_torch_version(torch)
    out = {CUDA_VAR: conf}
    if vendor == "hip":
        out[HIP_VAR] = conf
    if version is None or version >= GENERIC_VAR_SINCE:
        out[GENERIC_VAR] = conf
    return out


# --- quoting, one function per shell --------------------------------------------------------

_BASH_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_PS_SAFE = re.compile(r"^[A-Za-z0-9_+=:./\\-]+$")
_CMD_SAFE = re.compile(r"^[A-Za-z0-9_+=:,./\\-]+$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote_bash(word: str) -> str:
    """POSIX-shell quoting: bare when harmless, else single quotes (`'` written as `'\\''`)."""
    if word and _BASH_SAFE.match(word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def _ps_literal(word: str) -> str:
    # PowerShell also treats the typographic single quotes as quote characters: double them all.
    return "'" + re.sub("(['\u2018\u2019\u201a\u201b])", r"\1\1", word) + "'"


def quote_powershell(word: str) -> str:
    """PowerShell argument quoting: bare when harmless, else a single-quoted verbatim string."""
    if word and _PS_SAFE.match(word):
        return word
    return _ps_literal(word)


def quote_cmd(word: str) -> str:
    """cmd.exe quoting: double quotes make `& | < > ^ ( )` and spaces literal.

    cmd has no escape for `"` inside quotes and expands `%NAME%` everywhere, so words holding
    either cannot be written reliably: refused with an `InputError` rather than rendered wrong.
    """
    if any(c in word for c in '"%\r\n'):
        raise InputError(f'{word!r} cannot be written safely for cmd.exe (contains " or %); use PowerShell')
    if word and _CMD_SAFE.match(word):
        return word
    return f'"{word}"'


def quote_python(word: str) -> str:
    """A double-quoted Python string literal (JSON string syntax is valid Python)."""
    return json.dumps(word, ensure_ascii=False)


def _check(assignments: Mapping[str, str]) -> None:
    if not assignments:
        raise InputError("no environment variables to render")
    for name, value in assignments.items():
        if not _NAME_RE.match(name):
            raise InputError(f"{name!r} is not a valid environment variable name")
        if any(c in value for c in "\n\r\0"):
            raise InputError(f"value of {name} contains a line break or NUL")


def _argv(command: Sequence[str] | str, quote) -> str:
    if isinstance(command, str):
        return command  # a command line the caller already wrote for this shell
    if not command:
        raise InputError("empty command")
    return " ".join(quote(a) for a in command)


def canonical_shell(shell: str) -> str:
    """Map `bash`/`sh`/`zsh`, `powershell`/`pwsh`, `cmd`, `python`/`py` to one of `SHELLS`."""
    try:
        return _SHELL_ALIASES[shell.lower()]
    except KeyError:
        raise InputError(f"unknown shell {shell!r}: choose one of {', '.join(SHELLS)}") from None


def render(assignments: Mapping[str, str], shell: str, command: Sequence[str] | str | None = None) -> str:
    """Text that sets `assignments` in `shell` and, when given, runs `command` with them.

    `command` is an argv list (quoted here for the shell) or a string used verbatim. Forms:

    * bash: `export NAME=value` lines, or `NAME=value ... cmd args` (scoped to that command);
    * powershell: `$env:NAME = 'value'` lines, then the command;
    * cmd: `set "NAME=value"` lines, then the command;
    * python: `os.environ["NAME"] = "value"` before `import torch`, or `subprocess.run` with
      an `env` holding them.
    """
    _check(assignments)
    kind = canonical_shell(shell)
    items = list(assignments.items())
    if kind == "bash":
        if command is None:
            return "\n".join(f"export {n}={quote_bash(v)}" for n, v in items)
        prefix = " ".join(f"{n}={quote_bash(v)}" for n, v in items)
        return f"{prefix} {_argv(command, quote_bash)}"
    if kind == "powershell":
        # In expression mode a bare word would be run as a command: the value is always quoted.
        lines = [f"$env:{n} = {_ps_literal(v)}" for n, v in items]
        if command is not None:
            line = _argv(command, quote_powershell)
            if not isinstance(command, str) and line.startswith("'"):
                line = "& " + line  # a quoted first word is a string in PowerShell, not a command
            lines.append(line)
        return "\n".join(lines)
    if kind == "cmd":
        for n, v in items:
            quote_cmd(v)  # validates: refuses " and %
        lines = [f'set "{n}={v}"' for n, v in items]
        if command is not None:
            lines.append(_argv(command, quote_cmd))
        return "\n".join(lines)
    # python
    if command is None:
        lines = ["import os", ""]
        lines += [f"os.environ[{quote_python(n)}] = {quote_python(v)}" for n, v in items]
        lines += ["", "import torch  # only after the variables are set: the allocator reads them once"]
        return "\n".join(lines)
    lines = ["import os", "import subprocess", "", "env = dict(os.environ)"]
    lines += [f"env[{quote_python(n)}] = {quote_python(v)}" for n, v in items]
    if isinstance(command, str):
        lines.append(f"subprocess.run({quote_python(command)}, shell=True, env=env, check=True)")
    else:
        if not command:
            raise InputError("empty command")
        args = ", ".join(quote_python(a) for a in command)
        lines.append(f"subprocess.run([{args}], env=env, check=True)")
    return "\n".join(lines)


def render_all(
    assignments: Mapping[str, str],
    command: Sequence[str] | str | None = None,
    shells: Sequence[str] = SHELLS,
) -> dict[str, str]:
    """`{shell: text}` for every shell in `shells` (default: bash, powershell, cmd, python).

    A string `command` is shell-specific text and is only accepted for a single shell; pass an
    argv list to render it everywhere.
    """
    if isinstance(command, str) and len(shells) > 1:
        raise InputError("a command string is specific to one shell; pass the command as a list of arguments")
    return {canonical_shell(s): render(assignments, s, command) for s in shells}
