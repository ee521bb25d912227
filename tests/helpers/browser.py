"""A real headless Chromium driven over the DevTools protocol (a websocket; the ``websockets`` package
MLflow's server already brings): one browser session across several pages, its cookies read from the
browser itself. ``--dump-dom`` runs one page a process, and a session cookie dies with the process, so a
test of what one page can do with another's cookie needs this."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
    "--remote-debugging-port=0",
    "about:blank",
]


#: a one-page process (``--dump-dom``, ``--screenshot``): headless, a new profile each time (the caller's
#: ``--user-data-dir``), no network of its own, a laptop's window, 20 s of virtual time for the page's scripts
ONE_PAGE = [*FLAGS[:6], "--disable-quic", *FLAGS[6:8], "--virtual-time-budget=20000"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no Chromium here (apt-get install chromium): the browser check needs a real browser")
    return found


class Browser:
    """``with Browser(profile) as b: b.open(url); b.evaluate("...")``: one tab, its page's JavaScript, and
    every cookie the browser holds."""

    def __init__(self, profile) -> None:
        self.process = subprocess.Popen(
            [chromium(), *FLAGS[:-1], f"--user-data-dir={profile}", FLAGS[-1]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        line = ""
        while "DevTools listening on" not in line:
            assert self.process.poll() is None and time.monotonic() < deadline, line
            line = self.process.stderr.readline()
        self.endpoint = re.search(r"(ws://\S+)", line).group(1)
        self.loop = asyncio.new_event_loop()
        self.socket = self.loop.run_until_complete(self._connect())
        self.ids = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    async def _connect(self):
        import websockets

        return await websockets.connect(self.endpoint, max_size=2**26)

    def call(self, method: str, session: bool = False, **params):
        self.ids += 1
        message = {"id": self.ids, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session

        async def exchange():
            await self.socket.send(json.dumps(message))
            while True:
                answer = json.loads(await asyncio.wait_for(self.socket.recv(), 120))
                if answer.get("id") == self.ids:
                    return answer

        answer = self.loop.run_until_complete(exchange())
        assert "error" not in answer, (method, answer["error"])
        return answer["result"]

    def open(self, url: str, settle: float = 4.0) -> None:
        """Load ``url`` in the tab and give its scripts ``settle`` seconds."""
        self.call("Page.navigate", session=True, url=url)
        time.sleep(settle)

    def evaluate(self, expression: str, wait: bool = False):
        """The value of a JavaScript expression in the page (``wait``: a promise, awaited)."""
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, awaitPromise=wait, returnByValue=True
        )
        return result["result"].get("value")

    def cookies(self) -> list[dict]:
        return self.call("Storage.getCookies")["cookies"]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.loop.run_until_complete(self.socket.close())
        finally:
            self.loop.close()
            self.process.kill()
            self.process.wait()
