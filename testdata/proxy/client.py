"""A pipeline's own HTTP code, pointed at auditd's proxy route.

The proxy tests (cmd/auditd/proxy_test.go) start this as a real client
process with Debian's python3 and python3-requests or python3-httpx. It
sends --n GET requests through auditd, round robin over --sources, and
prints one JSON line: the statuses it got and, per response, auditd's
headers. With --stop-file it stops early, once that file exists. A
connection that breaks (auditd killed mid-request) is counted, not fatal.
docs/PROXY.md shows requests_session and httpx_client as its examples:
they are the whole change a pipeline makes.
"""
import argparse
import json
import os
import sys


def requests_session(base, token, run):
    """A requests Session that sends every request through auditd."""
    import requests

    s = requests.Session()
    s.headers["Proxy-Authorization"] = "Bearer " + token  # auditd's token, never forwarded
    s.headers["Auditd-Run"] = run  # the proxy-mode run the requests belong to
    return s, f"{base}/proxy", requests.RequestException


def httpx_client(base, token, run):
    """An httpx Client that sends every request through auditd."""
    import httpx

    c = httpx.Client(
        base_url=f"{base}/proxy",
        headers={"Proxy-Authorization": "Bearer " + token, "Auditd-Run": run},
        timeout=60,
    )
    return c, "", httpx.HTTPError


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="auditd's URL")
    ap.add_argument("--token", required=True, help="the pipeline's auditd token")
    ap.add_argument("--run", required=True, help="the proxy-mode run")
    ap.add_argument("--sources", required=True, help="comma-separated source ids")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--worker", type=int, default=0)
    ap.add_argument("--lib", choices=["requests", "httpx"], default="requests")
    ap.add_argument("--stop-file", default="", help="stop once this file exists")
    ap.add_argument("--upstream-token", default="", help="an Authorization the pipeline sends, which must not reach the upstream")
    a = ap.parse_args()

    make = requests_session if a.lib == "requests" else httpx_client
    s, prefix, errors = make(a.base, a.token, a.run)
    if a.upstream_token:
        s.headers["Authorization"] = "Bearer " + a.upstream_token
    sources = a.sources.split(",")
    out = {"worker": a.worker, "lib": a.lib, "statuses": {}, "errors": 0, "dispatch_seqs": [], "attempts": 0}
    for i in range(a.n):
        if a.stop_file and os.path.exists(a.stop_file):
            break
        src = sources[i % len(sources)]
        try:
            r = s.get(f"{prefix}/{src}/data/w{a.worker}/r{i}.json", params={"f": "json", "i": i}, timeout=60)
        except errors:
            out["errors"] += 1
            continue
        if r.status_code == 200:
            try:
                r.json()  # the upstream's JSON, as the pipeline reads it
            except ValueError:
                # Cut off: urllib3 1.x does not check Content-Length, so a
                # body that ended early reads as a short one.
                out["errors"] += 1
                continue
        out["statuses"][str(r.status_code)] = out["statuses"].get(str(r.status_code), 0) + 1
        if "Auditd-Dispatch-Seq" in r.headers:
            out["dispatch_seqs"].append(int(r.headers["Auditd-Dispatch-Seq"]))
        out["attempts"] += int(r.headers.get("Auditd-Attempts", "0"))
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
