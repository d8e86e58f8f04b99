"""Headless Chromium driven over the DevTools protocol, for the slide decks and the book.

Used to print decks to PDF and to test them the way an instructor's browser sees them: did reveal.js
start, how many slides, which requests left localhost, which console errors appeared, did every image
load, is the first slide blank; and to open the book's pages the same way (``Chromium.visit``). Only the standard
library and ``websocket-client`` (a Jupyter dependency).
"""
from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-default-apps",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars", "--disable-quic"]


def find_chromium() -> str | None:
    exe = os.environ.get("DDLCOURSE_CHROMIUM")
    if exe:
        return exe
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class StaticServer:
    """Serve a folder on 127.0.0.1 in a background thread (``with StaticServer(dir) as url:``)."""

    def __init__(self, folder: Path | str):
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class PageReport:
    url: str
    ready: bool = False
    total_slides: int = -1
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    images: int = 0
    broken_images: int = 0
    screenshot: bytes = b""
    overflowing: list[dict] = field(default_factory=list)   # slides running past the slide (course decks)

    @property
    def external_requests(self) -> list[str]:
        out = []
        for u in self.requests:
            p = urlparse(u)
            if p.scheme in ("data", "blob", "about", "chrome", "devtools"):
                continue
            if p.hostname not in ("127.0.0.1", "localhost", "::1"):
                out.append(u)
        return out


class Chromium:
    """One headless Chromium with one page, driven over CDP. ``with Chromium() as b: b.open(url)``."""

    def __init__(self, exe: str | None = None, width: int = 1280, height: int = 720):
        self.exe = exe or find_chromium()
        if not self.exe:
            raise FileNotFoundError("no Chromium found: install Debian's 'chromium' package (env/install_chromium.sh) "
                                    "or set DDLCOURSE_CHROMIUM")
        self.width, self.height = width, height
        self._id = 0
        self.events: list[dict] = []

    def __enter__(self) -> "Chromium":
        import websocket

        self.profile = tempfile.mkdtemp(prefix="ddl-chromium-")
        port = _free_port()
        self.proc = subprocess.Popen(
            [self.exe, *FLAGS, f"--remote-debugging-port={port}", f"--user-data-dir={self.profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 30
        targets = None
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    targets = [t for t in json.load(r) if t.get("type") == "page"]
                if targets:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"Chromium exited with code {self.proc.returncode} at start")
            time.sleep(0.2)
        if not targets:
            self.__exit__()
            raise RuntimeError("Chromium did not open its DevTools port within 30 s")
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc):
        try:
            self.ws.close()
        except Exception:
            pass
        if getattr(self, "proc", None) is not None:
            try:
                os.killpg(self.proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(getattr(self, "profile", ""), ignore_errors=True)

    def send(self, method: str, **params) -> dict:
        self._id += 1
        my_id = self._id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def eval(self, expr: str):
        r = self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"JS error in {expr!r}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def open(self, url: str, wait_ready: float = 30.0) -> PageReport:
        """Load ``url`` and wait for reveal.js to be ready (or ``wait_ready`` s)."""
        self.events.clear()
        self.send("Page.navigate", url=url)
        rep = PageReport(url)
        deadline = time.time() + wait_ready
        while time.time() < deadline:
            try:
                if self.eval("!!(window.Reveal && Reveal.isReady && Reveal.isReady())"):
                    rep.ready = True
                    break
            except RuntimeError:
                pass
            time.sleep(0.2)
        if rep.ready:
            # let KaTeX and images settle, and the course template fit its slides (window.ddlFitDone)
            self.eval("new Promise(r => setTimeout(r, 300))")
            while time.time() < deadline and self.eval("window.ddlFitDone === false"):
                time.sleep(0.1)
            rep.overflowing = json.loads(self.eval(
                "window.ddlOverflowing ? JSON.stringify(ddlOverflowing()) : '[]'") or "[]")
            rep.total_slides = int(self.eval("Reveal.getTotalSlides()"))
            rep.ready = bool(self.eval("document.querySelector('.reveal').classList.contains('ready')"))
        return self._report(rep)

    def visit(self, url: str, timeout: float = 30.0) -> PageReport:
        """Load a page that is not a deck (the book's) and wait until it and its images have loaded (``ready``)."""
        self.events.clear()
        self.send("Page.navigate", url=url)
        rep = PageReport(url)
        deadline = time.time() + timeout
        while time.time() < deadline and not rep.ready:
            self.eval("0")                     # receives the events that came meanwhile
            rep.ready = any(ev.get("method") == "Page.loadEventFired" for ev in self.events)
            time.sleep(0.1)
        self.eval("new Promise(r => setTimeout(r, 300))")     # the page's own scripts (search, math) run on load
        return self._report(rep)

    def _report(self, rep: PageReport) -> PageReport:
        """Fill in what the page loaded: images, a screenshot, requests and console errors."""
        imgs = self.eval("Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)") or []
        rep.images, rep.broken_images = len(imgs), sum(1 for ok in imgs if not ok)
        rep.screenshot = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Network.requestWillBeSent":
                rep.requests.append(p["request"]["url"])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                rep.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                rep.console_errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                rep.console_errors.append(f"{p['entry'].get('text')} ({p['entry'].get('url', '')})")
        return rep

    def print_pdf(self, url: str, path: Path | str, width_in: float = 10.0, height_in: float = 7.29) -> int:
        """Print a deck (opened with ``?print-pdf``) to ``path``; returns the page count."""
        sep = "&" if "?" in url else "?"
        rep = self.open(url.split("#")[0] + f"{sep}print-pdf")
        if not rep.ready:
            raise RuntimeError(f"reveal.js did not start for {url}")
        self.eval("new Promise(r => setTimeout(r, 500))")
        data = self.send("Page.printToPDF", printBackground=True, preferCSSPageSize=True,
                         paperWidth=width_in, paperHeight=height_in, marginTop=0, marginBottom=0,
                         marginLeft=0, marginRight=0)["data"]
        pdf = base64.b64decode(data)
        Path(path).write_bytes(pdf)
        return pdf_page_count(pdf)


def pdf_page_count(pdf: bytes) -> int:
    """Pages of a PDF written by Chromium (counts the /Type /Page objects)."""
    import re
    return len(re.findall(rb"/Type\s*/Page(?!s)", pdf))


def png_is_blank(png: bytes, min_std: float = 0.01) -> bool:
    """True if an image is (nearly) one flat colour."""
    import io

    import matplotlib.image as mpimg
    img = mpimg.imread(io.BytesIO(png), format="png")
    return float(img[..., :3].std()) < min_std
