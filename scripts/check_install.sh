#!/usr/bin/env bash
# The install a user gets: a clean virtualenv with `pip install .` (no extras), `gateway serve` on
# config.example.yaml, and the README's curl answered. Run by .ci/run; prints how long each step took.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
PORT="${CHECK_INSTALL_PORT:-4099}"
FAKE_PORT="${CHECK_INSTALL_FAKE_PORT:-18099}"
SERVER=""
FAKE=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "$FAKE" ]; then kill "$FAKE" 2>/dev/null || true; wait "$FAKE" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

started=$(date +%s)
"$PYTHON" -m venv "$WORK/venv"
if ! { "$WORK/venv/bin/pip" install --quiet --upgrade pip && "$WORK/venv/bin/pip" install --quiet "$REPO"; } \
    > "$WORK/pip.log" 2>&1; then
  echo "check-install: pip install . failed:" >&2; grep -v "is ignored: it is neither" "$WORK/pip.log" | tail -30 >&2
  exit 1
fi
installed=$(date +%s)
echo "check-install: pip install . took $((installed - started)) s"

# The example config, beside its own SQLite file and blob folder (relative paths follow the config).
cp "$REPO/config.example.yaml" "$WORK/config.yaml"
(cd "$WORK" && exec "$WORK/venv/bin/gateway" serve --config "$WORK/config.yaml" --port "$PORT" \
  > "$WORK/serve.log" 2>&1) &
SERVER=$!

answer=""
for _ in $(seq 1 180); do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "check-install: gateway serve exited early:" >&2; tail -20 "$WORK/serve.log" >&2; exit 1
  fi
  answer=$(curl -s --max-time 5 "http://127.0.0.1:$PORT/v1/chat/completions" \
    -H "Authorization: Bearer sk-acme-1" -H "Content-Type: application/json" \
    -d '{"model": "demo", "messages": [{"role": "user", "content": "hello"}]}' || true)
  if [ -n "$answer" ]; then break; fi
  sleep 0.5
done
answered=$(date +%s)
if ! printf '%s' "$answer" | grep -q "offline demo model"; then
  echo "check-install: the README's curl did not get the demo answer: $answer" >&2
  tail -20 "$WORK/serve.log" >&2
  exit 1
fi
echo "check-install: the README's curl answered $((answered - installed)) s after the install"

# The first run's demo: the bundled session (package data) through the same server.
if ! "$WORK/venv/bin/gateway" demo --url "http://127.0.0.1:$PORT" > "$WORK/demo.log" 2>&1; then
  echo "check-install: gateway demo failed:" >&2; tail -5 "$WORK/demo.log" >&2; exit 1
fi
echo "check-install: $(grep '^session ' "$WORK/demo.log")"

# The offline agent of the README's "Try your agent offline": the fake upstream, from the install alone.
"$WORK/venv/bin/gateway" fake-upstream --port "$FAKE_PORT" > "$WORK/fake.log" 2>&1 &
FAKE=$!
called=""
for _ in $(seq 1 60); do
  if ! kill -0 "$FAKE" 2>/dev/null; then
    echo "check-install: gateway fake-upstream exited early:" >&2; tail -20 "$WORK/fake.log" >&2; exit 1
  fi
  called=$(curl -s --max-time 5 "http://127.0.0.1:$FAKE_PORT/v1/messages" -H "Content-Type: application/json" \
    -d '{"model": "claude-x", "max_tokens": 64, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
         "messages": [{"role": "user", "content": "What is in this folder?"}]}' || true)
  if [ -n "$called" ]; then break; fi
  sleep 0.5
done
if ! printf '%s' "$called" | grep -q '"name": *"Bash"'; then
  echo "check-install: gateway fake-upstream did not ask for the Bash tool: $called" >&2; exit 1
fi
echo "check-install: gateway fake-upstream plays an agent (asked for Bash)"

# The image, built the same way, where a Docker daemon answers (none on the CI machine: it is said).
if command -v docker > /dev/null && docker info > /dev/null 2>&1; then
  docker build --quiet -f "$REPO/deploy/Dockerfile" -t context-gateway:check "$REPO" > "$WORK/docker.log" 2>&1 \
    || { echo "check-install: docker build failed:" >&2; tail -20 "$WORK/docker.log" >&2; exit 1; }
  kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""  # the port is the image's now
  # the example config with its SQLite file and blobs in the image's writable /data
  sed -e 's|sqlite:///./gateway.db|sqlite:////data/gateway.db|' -e 's|{dir: ./blobs}|{dir: /data/blobs}|' \
    "$REPO/config.example.yaml" > "$WORK/image-config.yaml"
  cid=$(docker run -d --rm -p "127.0.0.1:$PORT:4000" \
    -v "$WORK/image-config.yaml:/etc/gateway/config.yaml:ro" context-gateway:check)
  trap 'docker rm -f "$cid" > /dev/null 2>&1; cleanup' EXIT
  for _ in $(seq 1 120); do
    answer=$(curl -s --max-time 5 "http://127.0.0.1:$PORT/v1/chat/completions" \
      -H "Authorization: Bearer sk-acme-1" -H "Content-Type: application/json" \
      -d '{"model": "demo", "messages": [{"role": "user", "content": "hello"}]}' || true)
    if printf '%s' "$answer" | grep -q "offline demo model"; then break; fi
    sleep 1
  done
  printf '%s' "$answer" | grep -q "offline demo model" \
    || { echo "check-install: the image did not answer the README's curl" >&2; docker logs "$cid" | tail -20 >&2; exit 1; }
  echo "check-install: the Docker image answers the README's curl"
else
  echo "check-install: no Docker daemon here: the image was not built"
fi
