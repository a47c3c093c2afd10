#!/usr/bin/env python3
"""Opens a page in headless Chromium (through chromedriver's WebDriver protocol, standard
library only), prints the lines the page appends to its #log element as they come, and
exits when the page's title starts with "done": 0 for "done: pass", 1 otherwise, 1 on a
timeout.

Usage: web_page.py URL [TIMEOUT_SECONDS]
"""
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# The flags that give headless Chromium its WebGPU adapter (SwiftShader) here.
CHROME_ARGS = [
    "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--enable-webgpu-developer-features",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--disable-quic", "--disable-dev-shm-usage",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["value"]


def main():
    url = sys.argv[1]
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 1800
    port = free_port()
    driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    session = None
    try:
        for _ in range(100):
            try:
                call(base, "GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        profile = tempfile.mkdtemp(prefix="web-page-chromium-")
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": "/usr/bin/chromium", "args": CHROME_ARGS + [f"--user-data-dir={profile}"]}}}}
        session = call(base, "POST", "/session", caps)["sessionId"]
        # The page runs its work after loading; navigation returns once it has loaded.
        call(base, "POST", f"/session/{session}/timeouts", {"script": 60000, "pageLoad": 120000})
        call(base, "POST", f"/session/{session}/url", {"url": url})
        printed = 0
        deadline = time.monotonic() + timeout
        script = 'const l = document.getElementById("log"); return [document.title, l ? l.textContent : ""];'
        while True:
            title, text = call(base, "POST", f"/session/{session}/execute/sync", {"script": script, "args": []})
            lines = text.split("\n")
            complete = lines[:-1]  # the last piece is an unfinished line (or empty)
            for line in complete[printed:]:
                print(line, flush=True)
            printed = len(complete)
            if title.startswith("done"):
                return 0 if title == "done: pass" else 1
            if time.monotonic() > deadline:
                print(f"web_page: timed out after {timeout:.0f} s (title {title!r})", flush=True)
                return 1
            time.sleep(0.5)
    finally:
        if session is not None:
            try:
                call(base, "DELETE", f"/session/{session}")
            except OSError:
                pass
        driver.terminate()
        driver.wait()


if __name__ == "__main__":
    sys.exit(main())
