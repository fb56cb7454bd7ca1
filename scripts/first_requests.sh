#!/usr/bin/env bash
# A fresh `specdec serve` on the bundled model (policy never): 6 chat requests one after another, then two rounds
# of 4 at once (64 tokens, greedy, curl on 127.0.0.1), each request's seconds, and the server's RssAnon after.
# What a slot's first request costs against a slot already used (docs/results/kv-pages.md). Run it before and
# after a change, alternated, on an idle machine:
#     .venv/bin/specdec profile --json /tmp/profile.json --quiet     # once: the policy's pass costs, not re-measured
#     scripts/first_requests.sh LABEL /tmp/profile.json [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
label=$1 profile=$2 port=${3:-8911}
.venv/bin/specdec serve --port "$port" --policy never --profile "$profile" > /dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 90); do curl -s "127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
req() {
  curl -s -o /dev/null -w "%{time_total}" "127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"SmolLM2-135M-Instruct\", \"messages\": [{\"role\": \"user\", \"content\": \"$1\"}],
         \"max_tokens\": 64, \"temperature\": 0}"
}
one=""
for i in 1 2 3 4 5 6; do one="$one $(req "Write a short story about a cat number $i.")"; done
tmp=$(mktemp -d)
four=""
for j in 1 2; do
  pids=""
  for i in 1 2 3 4; do req "Write a poem about a dog number $i$j." > "$tmp/$i" & pids="$pids $!"; done
  wait $pids
  four="$four [$(cat "$tmp/1") $(cat "$tmp/2") $(cat "$tmp/3") $(cat "$tmp/4")]"
done
rm -rf "$tmp"
echo "$label | one after another, s:$one | 4 at once, s:$four | $(grep RssAnon "/proc/$server/status" | tr -s ' \t' ' ')"
