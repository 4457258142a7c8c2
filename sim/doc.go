// Package sim is auditd's built-in hostile upstream: HTTP servers that enforce
// hidden rate limits the way real gateways do, fail, lie, page and stall as a
// scenario file says, and count every request they receive so a test can tie
// them out against the ledger's dispatch counts.
//
// Tests mount one upstream per httptest server (Handler) and drive time with a
// shared clock.Fake, so thousands of requests against a one-per-second limit
// run in milliseconds. `auditd sim` serves a whole scenario on loopback
// listeners (Start) on the real clock.
//
// # Hidden limits: exactly what each shape admits
//
// A limit is Requests per Window (window default 1s). Offsets are measured
// from New on the simulator's clock. Rejected requests never count against a
// limit. With R = Requests, W = Window and B = Burst, the sustained rate of
// every shape is exactly R/W (Limit.PerSecond); they differ in bursts:
//
//   - leaky_bucket: nginx limit_req with nodelay (GCRA). A request is admitted
//     when the bucket, drained at R/W since the last request, holds at most B
//     requests, i.e. at most B+1 with this one. From idle it admits B+1 back
//     to back; under constant pressure the k-th admission (k from 0) is at
//     max(0, k-B)·W/R. In any interval of length d it admits at most
//     B+1+floor(d·R/W). Burst defaults to 0, as in nginx.
//   - token_bucket: the same algorithm with capacity B (default R), starting
//     full: B back to back, then one every W/R; at most B+floor(d·R/W) in
//     any interval of length d. Token bucket B equals leaky bucket B-1.
//   - fixed_window: at most R in each window [k·W, (k+1)·W) after the start
//     (windows are aligned to the start, not the wall clock), so up to 2R in
//     an interval of length W straddling a boundary.
//   - sliding_window: at most R admitted in any half-open interval (t-W, t];
//     an admitted request stops counting exactly W after it. Admissions i and
//     i+R are at least W apart.
//   - none: no limit.
//
// A limit's changes (`after: 30s` with new requests, and optionally window or
// burst) take effect at that offset: a bucket keeps its water (counted in
// requests), a sliding window keeps its log, and a fixed window keeps its
// count unless the window length changed. Upstreams naming the same group
// share one enforcer: the group's limit is their combined budget.
//
// # What a response looks like
//
// Checks run in a gateway's order: a dropping outage (the network), the
// required header, the limit, a failing backend (outage status), body errors,
// then content. Every response carries a Date header, shifted by date_skew.
// A rejected request gets reject.status (429 or 503) and Retry-After in the
// configured form: delta seconds (the wait rounded up), an HTTP-date
// (imf_fixdate, rfc850 or asctime; the upstream's skewed now plus the wait,
// rounded up to a second) or none. retry_after_fixed sends a fixed, possibly
// wrong, hint instead of the true wait. With advertise, every response that
// passed the limiter (admitted or not) also carries
//
//	x_ratelimit       X-RateLimit-Limit: R, X-RateLimit-Remaining, X-RateLimit-Reset: seconds
//	x_ratelimit_unix  the same, with X-RateLimit-Reset as a unix timestamp
//	ietf              RateLimit-Policy: "default";q=R;w=W  and  RateLimit: "default";r=remaining;t=seconds
//
// where remaining is how many requests could be admitted back to back now and
// reset is when the limit is fully replenished (the bucket empty, the window
// over, the log expired).
//
// # Scenario files
//
// Scenarios are YAML; unknown fields, values of the wrong type and values out
// of range are rejected with a *ScenarioError naming the line and the field.
// Durations are Go durations ("1500ms", "2m"). testdata/scenarios holds one
// example per behaviour. Every field:
//
//	name: demo                 # informational
//	description: ...           # informational
//	seed: 42                   # generated content depends on seed and upstream name only
//	groups:                    # shared gateways
//	  - name: county-gateway
//	    limit: {shape: fixed_window, requests: 60, window: 1m}
//	upstreams:
//	  - name: county-a         # [A-Za-z0-9._-], unique; printed by `auditd sim`
//	    group: county-gateway  # or an own limit, not both; neither means unlimited
//	    limit:
//	      shape: leaky_bucket  # leaky_bucket | token_bucket | fixed_window | sliding_window | none
//	      requests: 10         # per window, 1..1e6
//	      window: 1s           # 1ms..24h
//	      burst: 5             # leaky_bucket and token_bucket only
//	      changes:
//	        - {after: 30s, requests: 5}      # window, burst: optional
//	    path: /arcgis/rest/services/parcels/FeatureServer/0/query  # appended to the base URL
//	    port: 0                # Start only; 0 picks a free port
//	    reject:
//	      status: 429          # or 503
//	      retry_after: delta   # delta | imf_fixdate | rfc850 | asctime | none
//	      retry_after_fixed: 24h
//	      advertise: none      # none | x_ratelimit | x_ratelimit_unix | ietf
//	    date_skew: -90s        # the upstream's clock error
//	    outages:               # [from, to) after the start
//	      - {from: 30s, to: 90s, status: 503}  # 500 | 502 | 503 (default)
//	      - {from: 2m, to: 2m30s, drop: true}  # close the connection, no response
//	    body_errors:           # errors inside a 200 body
//	      - {style: grants_gov, every: 7}      # {"errorcode":1,"msg":...}
//	      - {style: arcgis, from: 1m, to: 2m, code: 498, message: Invalid token.}
//	    collection:
//	      kind: arcgis         # arcgis | wfs | grants_gov
//	      records: 2500
//	      max_page: 1000       # page cap, and page size when none is asked for
//	      layer: parcels       # default the upstream name
//	    latency: {fixed: 50ms, jitter: 20ms}  # on the simulator's clock
//	    response_bytes: 4096   # pad bodies of upstreams without a collection
//	    required_header:
//	      name: X-API-Key
//	      value: sim-secret
//	      status: 401          # 401 | 403 | 498 (ArcGIS: 200 with code 499 missing / 498 wrong)
//
// Body errors count the requests that reached the content stage: `every: 7`
// fails the 7th, 14th, ... of them; with from and to only those in the period
// count, and without every all of them fail.
//
// Collections: arcgis answers resultOffset / resultRecordCount (and
// returnCountOnly=true) with features and exceededTransferLimit: true while
// more follow; wfs answers startIndex / count with a GeoJSON FeatureCollection
// carrying numberMatched and numberReturned; grants_gov answers a POSTed JSON
// body's startRecordNum / rows with data.hitCount and data.oppHits. Content
// depends only on the seed, the upstream name and the request, never on the
// clock, so payload hashes are stable across runs.
//
// # Caveats
//
// Latency waits on the simulator's clock: on a clock.Fake a request with
// latency blocks until the test advances the clock, and an httptest server
// with such a request in flight cannot close until the clock moves or
// Sim.Close ends the wait (the request is then dropped). The simulator does
// not route: every path of an upstream answers the same way. The leaky
// bucket rejects at once (nodelay); nginx's delaying mode is not simulated.
package sim
