#!/bin/sh
# Pools every process's Loop1000x20 and Loop1000x20Nginx result that the
# sixth and seventh sessions kept in docs/bench, labelled by the code it ran
# (code=base: the timed path as of de5f2af; code=blocks: ledger events in
# blocks, d2fd1ea on), for one benchstat over all of them:
#
#   scripts/pool-fetch-figures.sh > pooled.txt && go tool benchstat -col /code pooled.txt
#
# A line is one process (one run, or the mean of five). Sub-benchmark labels
# of the A/B files are kept only to pick the side that ran the code named.
set -eu
cd "$(dirname "$0")/../docs/bench"

# pool FILE CODE [LABEL]: FILE's lines (those of sub-benchmark LABEL, if
# given) as code=CODE.
pool() {
	awk -v code="$2" -v label="${3:-}" '
		/^BenchmarkLoop1000x20/ {
			if (label != "" && index($1, label) == 0) next
			name = $1
			sub(/\/[^-]*/, "", name)       # drop the A/B label
			sub(/-2$/, "/code=" code "-2", name)
			$1 = name
			print
		}' "$1"
}

pool fetch-wide-2026-11-30b.txt base
pool fetch-nginx-ab-2026-11-30.txt base
pool fetch-pagesize-ab-2026-11-30.txt base impl=base
pool fetch-pagesize-ab5-2026-11-30.txt base impl=base
pool fetch-final-2026-11-30b.txt base
pool fetch-final-2026-11-30c.txt base
pool fetch-gogc-2026-11-30.txt base gogc=100
pool fetch-wide-2026-11-30d.txt base
pool fetch-garbage-2026-11-30.txt base impl=base
pool fetch-wide-2026-11-30e.txt base
pool fetch-blocks-ab-2026-11-30.txt base impl=base
pool fetch-blocks-ab-2026-11-30.txt blocks impl=blocks
pool fetch-final-2026-11-30d.txt blocks
# From here on the calibration is the median of seven (e8a8fa9).
pool fetch-final-2026-11-30f.txt blocks
