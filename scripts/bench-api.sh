#!/usr/bin/env bash
# Load-test GET /v1/runs/{id}/reconciliation against a running auditd.
# usage: scripts/bench-api.sh URL TOKEN RUN_ID [RATE] [DURATION]
# Needs wrk2 (wrk with -R, constant rate) for a latency figure free of
# coordinated omission; installs it with apt-get when missing.
set -euo pipefail
url=${1:?usage: $0 URL TOKEN RUN_ID [RATE] [DURATION]}
token=${2:?token}
run=${3:?run id}
rate=${4:-200}
duration=${5:-60s}

wrk=$(command -v wrk2 || command -v wrk || true)
if [ -z "$wrk" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends wrk2 >/dev/null 2>&1 ||
    $sudo apt-get install -y -qq --no-install-recommends wrk >/dev/null
  wrk=$(command -v wrk2 || command -v wrk)
fi

args=(-t2 -c16 -d"$duration" --latency -H "Authorization: Bearer $token")
if "$wrk" -h 2>&1 | grep -q -- '-R'; then
  args+=(-R"$rate")
else
  echo "warning: $wrk has no -R (constant rate); it measures at maximum throughput instead of $rate req/s" >&2
fi
echo "$wrk ${args[*]/$token/***} $url/v1/runs/$run/reconciliation"
"$wrk" "${args[@]}" "$url/v1/runs/$run/reconciliation"
