#!/usr/bin/env bash
# Issue 5's API benchmark, end to end on loopback:
#
#   GET /v1/runs/{id}/reconciliation p99 <= 50 ms at 200 requests/s
#   for a run of 100k events, while the fetch loop is dispatching.
#
# It builds bin/auditd, serves a simulated upstream (`auditd sim`), starts
# `auditd serve` on a fresh data directory and a free port, fills the ledger
# with one finished run of >= 100,000 events, starts a second, slow run that
# keeps the fetch loop dispatching, then drives the reconciliation of the big
# run at a constant rate, open loop (scripts/loadgen: latency from each
# request's scheduled send time, so a slow server is not hidden by a
# generator that waits for it). It prints the figures and the verdict and
# exits 0 when the target is met, 1 when it is missed.
#
# usage: scripts/bench-api.sh
# Environment (defaults):
#   RATE=200 DURATION=30s       offered load
#   ITEMS=17500                 items of the big run (~6 events each)
#   MIN_EVENTS=100000           the big run must have at least this many
#   TOKENS=8                    auditor tokens the load is spread over (see below)
#   P99_MS=50                   the target
#   SLOW_RATE=20                dispatches/s of the background run
#   KEEP=1                      keep the temporary directory (logs, data)
#
# Budget: the reconciliation costs 5 units of its token's budget (api
# costReconcile; a finished run's report is cached) and a token gets 250,000
# units per 5 minutes with a burst of 110,000 (api.DefaultToken*), about 166
# reconciliations a second sustained. The script keeps serve's default
# budget (--token-limit/--token-window/--token-burst would raise it) and
# creates TOKENS auditor tokens through POST /v1/tokens that the load
# generator uses round-robin. Any 429 in the figures means the budget, not
# the server, answered.
#
# Needs go, curl and jq (installed with apt-get when missing).
set -euo pipefail

rate=${RATE:-200}
duration=${DURATION:-30s}
items=${ITEMS:-17500}
min_events=${MIN_EVENTS:-100000}
ntokens=${TOKENS:-8}
p99_target=${P99_MS:-50}
slow_rate=${SLOW_RATE:-20}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-api.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  # Children in reverse order of start: the server first, then the upstream.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
  done
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    local p=${pids[i]} n=0
    while kill -0 "$p" 2>/dev/null && ((n < 100)); do sleep 0.1; n=$((n + 1)); done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ "${KEEP:-}" = 1 ] || [ "$rc" -gt 1 ]; then
    echo "logs and data kept in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 2; }

need() {
  command -v "$1" >/dev/null && return
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  log "installing $1"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$1" >/dev/null
}
command -v go >/dev/null || die "go is not on PATH"
need curl
need jq

log "building bin/auditd and the load generator"
go build -o bin/auditd ./cmd/auditd
go build -o "$tmp/loadgen" ./scripts/loadgen

# --- upstream ---------------------------------------------------------------
# Two unlimited upstreams with small bodies and no latency: auditd's own
# source limits do all the pacing.
cat >"$tmp/scenario.yaml" <<'EOF'
name: bench-api
description: fast, unlimited upstreams for scripts/bench-api.sh
seed: 5
upstreams:
  - name: bulk
    path: /q
    limit: {shape: none}
  - name: slow
    path: /q
    limit: {shape: none}
EOF
bin/auditd sim --scenario "$tmp/scenario.yaml" --urls-out "$tmp/urls.json" \
  >"$tmp/sim.out" 2>"$tmp/sim.log" &
pids+=($!)
for ((i = 0; ; i++)); do
  [ -s "$tmp/urls.json" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$tmp/sim.log" >&2; die "auditd sim exited"; }
  ((i < 200)) || die "auditd sim wrote no URLs"
  sleep 0.05
done
bulk_url=$(jq -r .bulk "$tmp/urls.json")
slow_url=$(jq -r .slow "$tmp/urls.json")

# --- server -----------------------------------------------------------------
# bulk is generous (the big run should finish in seconds); slow dispatches
# SLOW_RATE a second so the background run outlasts the measurement.
cat >"$tmp/sources.yaml" <<EOF
sources:
  - id: bulk
    base_url: $bulk_url
    limit: 5000
    window: 1s
    concurrency: 32
  - id: slow
    base_url: $slow_url
    limit: $slow_rate
    window: 1s
    concurrency: 2
EOF
admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
AUDITD_BOOTSTRAP_TOKEN=$admin bin/auditd serve --data "$tmp/data" --addr 127.0.0.1:0 \
  --config "$tmp/sources.yaml" --start-limit 5000 --start-window 1s \
  >"$tmp/serve.out" 2>"$tmp/serve.log" &
pids+=($!)
server_pid=$!
for ((i = 0; ; i++)); do
  url=$(sed -n 's/^auditd is serving on \(http[^ ]*\).*/\1/p' "$tmp/serve.out")
  [ -n "$url" ] && curl -fsS "$url/healthz" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/serve.log" >&2; die "auditd serve exited"; }
  ((i < 400)) || die "auditd serve did not come up"
  sleep 0.05
done
log "auditd serve on $url (pid $server_pid), upstreams bulk=$bulk_url slow=$slow_url"

# api METHOD PATH [BODY-FILE]: the response body; fails on a non-2xx.
api() {
  local args=(-fsS -m "${API_TIMEOUT:-60}" -X "$1" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json')
  [ $# -ge 3 ] && args+=(--data-binary "@$3")
  curl "${args[@]}" "$url$2"
}

# items N SOURCE PREFIX: a POST /v1/runs body of N plain GET items.
run_body() {
  local n=$1 src=$2 name=$3
  awk -v n="$n" -v src="$src" -v name="$name" 'BEGIN {
    printf "{\"name\":\"%s\",\"items\":[", name
    for (i = 0; i < n; i++) printf "%s{\"key\":\"%s-%06d\",\"source\":\"%s\",\"path\":\"/q?n=%d\"}", (i ? "," : ""), name, i, src, i
    printf "]}"
  }'
}

wait_run() {
  local id=$1 deadline=$((SECONDS + $2)) st
  while :; do
    st=$(api GET "/v1/runs/$id" | jq -r .status)
    case $st in succeeded | partial | cancelled) echo "$st"; return ;; esac
    ((SECONDS < deadline)) || die "run $id still $st after $2 s"
    sleep 1
  done
}

# --- the big run --------------------------------------------------------------
log "creating the big run: $items items on bulk"
run_body "$items" bulk big >"$tmp/big.json"
big=$(api POST /v1/runs "$tmp/big.json" | jq -r .id)
t0=$SECONDS
big_status=$(wait_run "$big" 1800)
big_secs=$((SECONDS - t0))
big_events=$(curl -fsS -H "Authorization: Bearer $admin" -H 'Accept: application/x-ndjson' \
  "$url/v1/runs/$big/events" | wc -l)
read -r first_seq last_seq < <(api GET "/v1/runs/$big" | jq -r '"\(.first_seq) \(.last_seq)"')
log "big run $big: $big_status in ${big_secs}s, $big_events events (seq $first_seq..$last_seq)"
((big_events >= min_events)) || die "the big run has $big_events events, fewer than $min_events: raise ITEMS"

# --- tokens -------------------------------------------------------------------
: >"$tmp/tokens"
for ((i = 1; i <= ntokens; i++)); do
  printf '{"name":"bench-api-%d","role":"auditor"}' "$i" >"$tmp/token.json"
  api POST /v1/tokens "$tmp/token.json" | jq -r .secret >>"$tmp/tokens"
done

# One reconciliation on its own, before the load: the floor of the latency.
single_ms=$(curl -fsS -o "$tmp/reconciliation.json" -w '%{time_total}' \
  -H "Authorization: Bearer $admin" "$url/v1/runs/$big/reconciliation" | awk '{printf "%.1f", $1 * 1000}')
balanced=$(jq -r .balanced "$tmp/reconciliation.json")
recon_bytes=$(wc -c <"$tmp/reconciliation.json")
log "one reconciliation alone: ${single_ms} ms, $recon_bytes bytes, balanced=$balanced"

# --- the background run ---------------------------------------------------------
dur_s=$(awk -v d="$duration" 'BEGIN { n = d + 0; if (d ~ /ms$/) n /= 1000; else if (d ~ /m$/) n *= 60; print int(n + 0.999) }')
slow_items=$((slow_rate * (dur_s + 120)))
log "creating the background run: $slow_items items on slow at $slow_rate/s"
run_body "$slow_items" slow background >"$tmp/slow.json"
bg=$(api POST /v1/runs "$tmp/slow.json" | jq -r .id)
sleep 3
read -r bg_status bg_disp0 < <(api GET "/v1/runs/$bg" | jq -r '"\(.status) \(.counts.dispatches)"')
[ "$bg_status" = running ] || die "the background run is $bg_status, not running"

# --- the measurement ------------------------------------------------------------
log "GET /v1/runs/$big/reconciliation at $rate/s for $duration over $ntokens tokens"
cpu0=$(awk '{print $14 + $15}' "/proc/$server_pid/stat")
"$tmp/loadgen" -url "$url/v1/runs/$big/reconciliation" -tokens "$tmp/tokens" \
  -rate "$rate" -duration "$duration" >"$tmp/loadgen.out"
cpu1=$(awk '{print $14 + $15}' "/proc/$server_pid/stat")
# A server that stopped answering after the load is a finding, not a hang.
answering=yes
if ! bg_json=$(API_TIMEOUT=15 api GET "/v1/runs/$bg"); then
  answering=no
  bg_json='{"status":"unknown","counts":{"dispatches":"?"}}'
fi
read -r bg_status bg_disp1 < <(jq -r '"\(.status) \(.counts.dispatches)"' <<<"$bg_json")
server_cpu=$(awk -v a="$cpu0" -v b="$cpu1" -v hz="$(getconf CLK_TCK)" -v d="$dur_s" 'BEGIN { printf "%.2f", (b - a) / hz / d }')

get() { awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }' "$tmp/loadgen.out"; }
p99=$(get p99_ms)
echo
echo "== GET /v1/runs/{id}/reconciliation, $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "run: $big_events events, $items items, seq $first_seq..$last_seq, $big_status; reconciliation $recon_bytes bytes, balanced=$balanced"
echo "one reconciliation alone: ${single_ms} ms"
echo "offered: $rate/s for $duration, open loop, $ntokens auditor tokens round-robin"
sed 's/^/  /' "$tmp/loadgen.out"
echo "server CPU during the load: $server_cpu cores"
echo "background run $bg: $bg_status after the load; dispatches $bg_disp0 -> $bg_disp1 during it"
[ "$bg_status" = running ] || echo "warning: the background run was not running to the end of the load" >&2
if [ "$answering" = no ]; then
  echo "server after the load: /healthz $(curl -s -m 5 -o /dev/null -w %{http_code} "$url/healthz" || true)," \
    "authenticated requests time out: wedged; goroutine dump (SIGQUIT) in $tmp/serve.log"
  kill -QUIT "$server_pid" 2>/dev/null || true
  KEEP=1
fi
errs=$(get errors)
non200=$(get non_200)
verdict=MET
awk -v p="$p99" -v t="$p99_target" 'BEGIN { exit !(p <= t) }' || verdict=MISSED
[ "$errs" = 0 ] && [ "$non200" = 0 ] || verdict=MISSED
echo "verdict: p99 $p99 ms vs target <= $p99_target ms, $errs errors, $non200 non-200: $verdict"
[ "$verdict" = MET ]
