#!/usr/bin/env python3
"""Headless check of the browser trainer (examples/web_mlp), built into SITE by
tools/web-mlp.sh --build-only. Serves SITE on 127.0.0.1, drives Chromium through
chromedriver's WebDriver protocol (the Python standard library only), and checks:

1. a full run finishes, with a training accuracy of at least --min-accuracy percent, and a
   screenshot of the page (plot and numbers) is saved to --screenshot;
2. a device destroyed mid-run (`?lose=K`) ends in the page's DeviceLost error, not a hang;
3. an adapter without `timestamp-query` (hidden before the page runs) trains and says that
   its times are wall times;
4. a browser without WebGPU (navigator.gpu removed before the page runs) ends in NoWebGpu,
   and one whose requestAdapter() gives null in NoAdapter.

Exits non-zero with a message on the first failure.
"""

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    # Unquantized timestamps, and the adapter's name.
    "--enable-webgpu-developer-features",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=860,900",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, what, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit(f"web-mlp-check: {what} did not listen on port {port}")


class Session:
    """One Chromium session through chromedriver's W3C WebDriver endpoint."""

    def __init__(self, driver_port, user_data_dir):
        self.base = f"http://127.0.0.1:{driver_port}"
        capabilities = {
            "browserName": "chrome",
            # Return from navigation at once: the page trains after it has loaded.
            "pageLoadStrategy": "none",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": CHROMIUM_ARGS + [f"--user-data-dir={user_data_dir}"],
            },
        }
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        self.base += f"/session/{value['sessionId']}"

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as e:
            sys.exit(f"web-mlp-check: WebDriver {method} {path}: {e.code} {e.read()[:600]!r}")

    def before_page_scripts(self, source):
        """Runs `source` in every document this session loads, before the page's scripts."""
        self.call("POST", "/goog/cdp/execute", {"cmd": "Page.enable", "params": {}})
        self.call(
            "POST",
            "/goog/cdp/execute",
            {"cmd": "Page.addScriptToEvaluateOnNewDocument", "params": {"source": source}},
        )

    def load(self, url):
        self.call("POST", "/url", {"url": url})

    def script(self, source):
        return self.call("POST", "/execute/sync", {"script": source, "args": []})

    def wait_state(self, seconds):
        """Polls until <body data-state> is done or error; returns its data-* attributes."""
        deadline = time.time() + seconds
        last = None
        while time.time() < deadline:
            attributes = self.script(
                "return document.body ? Object.assign({status: "
                "(document.getElementById('status') || {}).textContent}, document.body.dataset) : null;"
            )
            if attributes and attributes.get("state") in ("done", "error"):
                return attributes
            if attributes and attributes.get("status") != last:
                last = attributes.get("status")
                print(f"web-mlp-check:   {last}", flush=True)
            time.sleep(1)
        sys.exit(f"web-mlp-check: the page did not finish within {seconds} s (last status: {last})")

    def screenshot(self, path):
        """The page's content, cut to its height (Chrome DevTools' capture with a clip)."""
        width, height = self.script(
            "return [document.documentElement.clientWidth,"
            " Math.ceil(document.body.getBoundingClientRect().bottom)];"
        )
        clip = {"x": 0, "y": 0, "width": width, "height": height + 24, "scale": 1}
        params = {"format": "png", "clip": clip, "captureBeyondViewport": True}
        value = self.call("POST", "/goog/cdp/execute", {"cmd": "Page.captureScreenshot", "params": params})
        with open(path, "wb") as f:
            f.write(base64.b64decode(value["data"]))

    def close(self):
        self.call("DELETE", "")


def expect_error(session, url, kinds, seconds):
    session.load(url)
    attributes = session.wait_state(seconds)
    if attributes.get("state") != "error" or attributes.get("error") not in kinds:
        sys.exit(f"web-mlp-check: {url}: expected an error of kind {kinds}, got {attributes}")
    print(f"web-mlp-check: {url}: {attributes['status']}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("site")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--min-accuracy", type=float, required=True, help="percent")
    parser.add_argument("--screenshot", required=True)
    parser.add_argument("--timeout", type=int, default=300, help="seconds for the full run")
    args = parser.parse_args()

    chromedriver = shutil.which("chromedriver")
    if chromedriver is None or not os.path.exists("/usr/bin/chromium"):
        sys.exit("web-mlp-check: needs chromium and chromedriver (tools/web-setup.sh installs both)")
    http_port, driver_port = free_port(), free_port()
    children = []
    profiles = tempfile.mkdtemp(prefix="web-mlp-check-")
    try:
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", args.site, str(http_port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        children.append(
            subprocess.Popen([chromedriver, f"--port={driver_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        wait_for_port(http_port, "the HTTP server")
        wait_for_port(driver_port, "chromedriver")
        page = f"http://127.0.0.1:{http_port}/index.html"

        # 1. The full run.
        session = Session(driver_port, os.path.join(profiles, "run"))
        started = time.time()
        session.load(f"{page}?steps={args.steps}")
        attributes = session.wait_state(args.timeout)
        elapsed = time.time() - started
        session.screenshot(args.screenshot)
        if attributes.get("state") != "done":
            sys.exit(f"web-mlp-check: the run failed: {attributes.get('status')} (screenshot {args.screenshot})")
        accuracy = float(attributes["accuracy"])
        print(
            f"web-mlp-check: {attributes['steps']} steps on {attributes.get('adapter')}: training accuracy "
            f"{accuracy:.2f} %, loss {float(attributes['loss']):.4f}; optimizer step "
            f"{attributes['optimizerUs']} µs ({attributes['timeSource']}); training loop "
            f"{attributes['wallS']} s, page {elapsed:.1f} s; screenshot {args.screenshot}"
        )
        if int(attributes["steps"]) != args.steps:
            sys.exit(f"web-mlp-check: the page ran {attributes['steps']} steps, not {args.steps}")
        if accuracy < args.min_accuracy:
            sys.exit(f"web-mlp-check: accuracy {accuracy:.2f} % is below {args.min_accuracy} %")

        # 2. A device destroyed after step 20.
        expect_error(session, f"{page}?steps=60&lose=20", ["DeviceLost"], 120)
        session.close()

        # 3. An adapter without timestamp queries.
        session = Session(driver_port, os.path.join(profiles, "wall"))
        session.before_page_scripts(
            "const features = Object.getOwnPropertyDescriptor(GPUAdapter.prototype, 'features').get;"
            "Object.defineProperty(GPUAdapter.prototype, 'features', {get() {"
            "  const set = new Set(features.call(this)); set.delete('timestamp-query'); return set; }});"
        )
        session.load(f"{page}?steps=20")
        attributes = session.wait_state(120)
        shown = session.script("return document.getElementById('numbers').textContent;")
        if attributes.get("state") != "done" or attributes.get("timeSource") != "wall" or "no timestamp-query" not in shown:
            sys.exit(f"web-mlp-check: without timestamp-query: {attributes}, page: {shown!r}")
        print(f"web-mlp-check: without timestamp-query the page times whole steps by wall clock: {attributes['wallS']} s")
        session.close()

        # 4. No WebGPU, and WebGPU without an adapter.
        for kind, source in [
            ("NoWebGpu", "delete Navigator.prototype.gpu;"),
            ("NoAdapter", "if (navigator.gpu) { navigator.gpu.requestAdapter = async () => null; }"),
        ]:
            session = Session(driver_port, os.path.join(profiles, kind))
            session.before_page_scripts(source)
            expect_error(session, f"{page}?steps=10", [kind], 60)
            session.close()
    finally:
        for child in children:
            child.terminate()
            child.wait(timeout=10)
        shutil.rmtree(profiles, ignore_errors=True)
    print("web-mlp-check: ok")


if __name__ == "__main__":
    main()
