"""A headless Chromium driven over the DevTools protocol through a pipe (stdlib only).

`chromium --remote-debugging-pipe` reads protocol commands from file descriptor 3 and writes
replies and events to descriptor 4, each a JSON text ended by a NUL byte: no websocket client,
no Playwright, no browser download. Used by the report page's browser test and by
`docs/images/make_explain_screenshot.py`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser() -> str | None:
    """`ALLOCTUNE_CHROMIUM`, else the first Chromium-like browser on PATH."""
    env = os.environ.get("ALLOCTUNE_CHROMIUM")
    if env:
        return env if os.path.exists(env) else shutil.which(env)
    return next((p for p in map(shutil.which, NAMES) if p), None)


class Browser:
    """One headless browser with one page (a flattened session); `events` keeps what it reported."""

    def __init__(self, executable: str, width: int = 1280, height: int = 900, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="alloctune-chromium-")
        import fcntl

        cmd_r, self._cmd_w = os.pipe()  # we write commands; the browser reads them on fd 3
        self._out_r, out_w = os.pipe()  # the browser writes on fd 4
        # the child's ends above 9, so moving them onto 3 and 4 cannot overwrite one with the other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, out_w)]
        os.close(cmd_r)
        os.close(out_w)
        cmd_r, out_w = high
        args = [executable, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--hide-scrollbars", "--disable-dev-shm-usage", f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}", "about:blank"]

        def child_fds() -> None:  # put the pipe ends where the browser looks for them (inheritable)
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        # close_fds=False: Popen would close 3 and 4 after `child_fds` otherwise; every other
        # descriptor Python opened is close-on-exec anyway (the two above included)
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=child_fds, close_fds=False)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Page.setLifecycleEventsEnabled", session=True, enabled=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("the browser closed its DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply (events that arrive meanwhile are kept)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, **params: Any) -> dict[str, Any]:
        """The first event of `method` whose params hold `params` (kept ones first, then new ones)."""

        def matches(e: dict[str, Any]) -> bool:
            p = e.get("params", {})
            return e.get("method") == method and all(p.get(k) == v for k, v in params.items())

        deadline = time.monotonic() + self.timeout
        for e in self.events:
            if matches(e):
                return e
        while True:
            e = self._read_message(deadline)
            self.events.append(e)
            if matches(e):
                return e

    def open(self, url: str) -> None:
        """Navigate and wait for the load of this navigation's document.

        `Page.loadEventFired` names no document, so a late one of the page before (an image that
        never arrives, an about:blank in between) would pass for this one; the lifecycle event
        carries the loader the navigation reported."""
        loader = self.call("Page.navigate", session=True, url=url).get("loaderId")
        if loader is None:  # same-document navigation: nothing new loads
            return
        self.wait_event("Page.lifecycleEvent", loaderId=loader, name="load")

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A real mouse click at viewport coordinates (press and release)."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, full_page: bool = False, max_height: int = 4000) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            h = min(max_height, int(self.evaluate("document.documentElement.scrollHeight")))
            w = int(self.evaluate("document.documentElement.scrollWidth"))
            params.update(clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1}, captureBeyondViewport=True)
        return base64.b64decode(self.call("Page.captureScreenshot", session=True, **params)["data"])

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries reported so far."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", ""))
        return out

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for so far (the page itself included)."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
