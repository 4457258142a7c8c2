"""Client libraries nobody at auditd wrote, pointed at auditd's proxy route
as docs/PROXY.md says (cmd/auditd/proxy_clients_test.go runs them with
Debian's python3-geopy and python3-owslib):

  services.py geocode --base URL --token T --run R --source S --n N
  services.py wfs     --base URL --token T --run R --source S --n N

Each prints one JSON line: what it got and how many calls raised.
"""
import argparse
import json
import sys


def headers(a):
    return {"Proxy-Authorization": "Bearer " + a.token, "Auditd-Run": a.run}


def geocode(a):
    from geopy.geocoders import Nominatim

    host = a.base.split("://", 1)[1]
    # The base URL goes in domain (with the proxy path), the two headers in
    # the geocoder's headers; the timeout covers auditd's pacing
    # (Auditd-Deadline, 30 s by default), not geopy's default of 1 s.
    g = Nominatim(user_agent="auditd-proxy-test", domain=f"{host}/proxy/{a.source}", scheme="http", timeout=60)
    g.headers.update(headers(a))
    found, errors = 0, []
    for i in range(a.n):
        try:
            loc = g.geocode(f"{100 + i} Capitol Mall, Sacramento, CA")
            if loc is not None and abs(loc.latitude - 38.5767) < 0.01:
                found += 1
        except Exception as e:  # noqa: BLE001 - counted, the test fails on any
            errors.append(repr(e))
    return {"found": found, "errors": len(errors), "error_texts": errors[:3]}


def wfs(a):
    from owslib.wfs import WebFeatureService

    # url is the service's URL on the proxy; OWSLib then follows the
    # operation URLs the capabilities name, which auditd has rewritten to
    # point at the proxy too.
    svc = WebFeatureService(url=f"{a.base}/proxy/{a.source}/wfs", version="1.1.0", headers=headers(a), timeout=60)
    get = [m.get("url") for m in svc.getOperationByName("GetFeature").methods if m.get("type").lower() == "get"]
    features, errors = 0, []
    for i in range(a.n):
        try:
            body = svc.getfeature(typename=["county:parcels"], maxfeatures=10, startindex=10 * i).read()
            if isinstance(body, bytes):
                body = body.decode()
            features += body.count("<county:parcels")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    return {"types": list(svc.contents), "getfeature_urls": get, "features": features, "errors": len(errors), "error_texts": errors[:3]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["geocode", "wfs"])
    p.add_argument("--base", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--n", type=int, default=5)
    a = p.parse_args()
    out = geocode(a) if a.what == "geocode" else wfs(a)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
