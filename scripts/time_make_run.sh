#!/usr/bin/env bash
# Times a fresh clone of this repository: `make run` with empty pip and uv caches, until the README's curl answers on :4000.
set -u
if ss -ltn "sport = :4000" | grep -q 4000; then echo "port 4000 is taken"; exit 1; fi
D=$(mktemp -d); git clone -q "$(cd "$(dirname "$0")/.." && pwd)" "$D/repo"; cd "$D/repo"
export PIP_NO_CACHE_DIR=1 UV_CACHE_DIR="$D/uvcache"
start=$(date +%s.%N)
( exec make run > "$D/run.log" 2>&1 ) & PID=$!
a=""
for i in $(seq 1 1200); do
  if ! kill -0 $PID 2>/dev/null; then echo "make run exited:"; tail -5 "$D/run.log"; break; fi
  a=$(curl -s --max-time 5 http://127.0.0.1:4000/v1/chat/completions -H "Authorization: Bearer sk-acme-1" -H "Content-Type: application/json" -d '{"model": "demo", "messages": [{"role": "user", "content": "hello"}]}' 2>/dev/null)
  if [ -n "$a" ]; then break; fi; sleep 0.25
done
end=$(date +%s.%N)
owner=$(ss -ltnp "sport = :4000" | grep -o "pid=[0-9]*" | cut -d= -f2)
echo "make run -> curl answered in $(echo "$end - $start" | bc) s (server pid $owner: $(readlink /proc/$owner/cwd))"; echo "$a" | head -c 120; echo
kill $owner 2>/dev/null; kill $PID 2>/dev/null; sleep 1; rm -rf "$D"
