#!/usr/bin/env bash
# The container gate, run by .ci/run after the test suite (docs/container.md):
#   1. the local base image from Debian's packages (scripts/make_base_image.sh; reused),
#   2. the project image on it, built with this machine's pip configuration
#      (scripts/image_pip_config.py -> BuildKit secrets; the build uses --network host),
#   3. `sticksat check` inside the container, without network, on benchmarks/graphs/tiny
#      against benchmarks/baselines/tiny.json: must exit 0,
#   4. `sticksat serve` in a detached container; /healthz, /readyz and one /compile are
#      asked from the host, and the image's own HEALTHCHECK must report healthy.
# Without a Docker engine (see .ci/setup/docker.sh) it prints why and exits 0; once an
# engine answers, any failing step fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's client (same version as the engine, BuildKit built in) before any other.
if [ -z "${DOCKER:-}" ]; then
    if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER
IMAGE=${STICKSAT_IMAGE:-sticksat:ci}
BASE=${STICKSAT_BASE_IMAGE:-sticksat-base:bookworm}
export STICKSAT_BASE_IMAGE=$BASE
SUITE=benchmarks/graphs/tiny
BASELINE=benchmarks/baselines/tiny.json

if [ "${STICKSAT_DOCKER:-}" = 0 ] || ! "$DOCKER" info >/dev/null 2>&1; then
    echo "container gate skipped: no Docker engine answers here (.ci/setup/docker.sh printed why)"
    exit 0
fi

start=$SECONDS
work=$(mktemp -d /tmp/sticksat-container-gate.XXXXXX)
chmod 0755 "$work"
pip_server=""
container=""
cleanup() {
    if [ -n "$container" ]; then "$DOCKER" rm -f -v "$container" >/dev/null 2>&1 || true; fi
    if [ -n "$pip_server" ]; then kill "$pip_server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
step() { echo "== container gate [$((SECONDS - start)) s]: $*"; }

# 1. base -----------------------------------------------------------------------------
t=$SECONDS
step "base image $BASE"
scripts/make_base_image.sh | sed 's/^/   /'
echo "base image ready: $BASE ($((SECONDS - t)) s)"

# 2. project image ---------------------------------------------------------------------
t=$SECONDS
step "pip configuration for the build"
python3 scripts/image_pip_config.py "$work/pip" 2> >(sed 's/^/   /' >&2) &
pip_server=$!
for _ in $(seq 60); do
    [ -f "$work/pip/pip.conf" ] && break
    kill -0 "$pip_server" 2>/dev/null || break
    sleep 0.5
done
[ -f "$work/pip/pip.conf" ] || { echo "container gate failed: scripts/image_pip_config.py wrote no pip.conf"; exit 1; }
sed 's/^/   pip.conf: /' "$work/pip/pip.conf"
secrets=(--secret "id=pip.conf,src=$work/pip/pip.conf")
[ -f "$work/pip/pip-cert" ] && secrets+=(--secret "id=pip-cert,src=$work/pip/pip-cert")

step "docker build --build-arg BASE=$BASE -t $IMAGE ."
if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress plain --network host --build-arg "BASE=$BASE" \
        "${secrets[@]}" --label org.sticksat.ci=1 -t "$IMAGE" . > "$work/build.log" 2>&1; then
    tail -n 60 "$work/build.log"
    echo "container gate failed: docker build"
    exit 1
fi
kill "$pip_server" 2>/dev/null || true
pip_server=""
# Earlier CI images this tag replaced (vfs keeps every layer whole on disk).
"$DOCKER" image prune -f --filter label=org.sticksat.ci=1 >/dev/null 2>&1 || true
# BuildKit's cache: enough for the next build of unchanged sources, bounded over many runs.
"$DOCKER" builder prune -f --keep-storage 2gb >/dev/null 2>&1 || true
image_id=$("$DOCKER" image inspect --format '{{.Id}}' "$IMAGE")
image_size=$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE")
image_user=$("$DOCKER" image inspect --format '{{.Config.User}}' "$IMAGE")
echo "image built: $image_id $((image_size / 1000000)) MB, user '$image_user' ($((SECONDS - t)) s)"
[ -n "$image_user" ] && [ "$image_user" != root ] && [ "$image_user" != 0 ] \
    || { echo "container gate failed: the image runs as root"; exit 1; }
"$DOCKER" run --rm --network none --entrypoint python "$IMAGE" -c \
    "import importlib.util as u, os, sys; t = u.find_spec('torch'); print('   in the image: uid', os.getuid(), 'python', sys.version.split()[0], 'torch', 'present' if t else 'absent'); sys.exit(1 if t or os.getuid() == 0 else 0)" \
    || { echo "container gate failed: the image has torch or runs as uid 0"; exit 1; }

# 3. the CI gate inside the container ---------------------------------------------------
t=$SECONDS
out="$work/out"
mkdir -p "$out"
chown 10001 "$out" 2>/dev/null || chmod 0777 "$out"
step "docker run --network none $IMAGE check $SUITE --baseline $BASELINE"
set +e
"$DOCKER" run --rm --network none \
    -v "$PWD/$SUITE:/w/graphs:ro" -v "$PWD/$BASELINE:/w/baseline.json:ro" -v "$out:/w/out" \
    "$IMAGE" check /w/graphs --baseline /w/baseline.json --tolerance 5 --junit /w/out/check.xml \
    > "$out/check.txt" 2>&1
code=$?
set -e
sed 's/^/   /' "$out/check.txt"
summary=$(python3 - "$out/check.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except (OSError, ET.ParseError) as exc:
    print(f"no JUnit XML ({exc})")
    raise SystemExit(0)
cases = list(cases)
failed = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
print(f"{len(cases)} graphs, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
EOF
)
echo "gate inside the container: exit $code, $summary ($((SECONDS - t)) s)"
[ "$code" = 0 ] || { echo "container gate failed: sticksat check in the container exited $code"; exit 1; }

# The same gate must fail from the image too: one graph against a baseline that says it
# used to take half its time (an injected regression) exits 1.
t=$SECONDS
mkdir -p "$work/regress"
cp "$SUITE/linear_tiny_m16_k64_n128.json" "$work/regress/"
python3 - "$BASELINE" "$work/regress.json" <<'EOF'
import json, sys
baseline = json.load(open(sys.argv[1]))
entry = baseline["graphs"]["linear_tiny_m16_k64_n128"]
entry["simulated_us"] /= 2
baseline["graphs"] = {"linear_tiny_m16_k64_n128": entry}
json.dump(baseline, open(sys.argv[2], "w"))
EOF
chmod -R a+rX "$work/regress" "$work/regress.json"
set +e
"$DOCKER" run --rm --network none -v "$work/regress:/w/graphs:ro" -v "$work/regress.json:/w/baseline.json:ro" \
    -v "$out:/w/out" "$IMAGE" check /w/graphs --baseline /w/baseline.json --tolerance 5 \
    --junit /w/out/regress.xml > "$out/regress.txt" 2>&1
code=$?
set -e
failure=$(python3 -c 'import sys, xml.etree.ElementTree as ET
f = ET.parse(sys.argv[1]).getroot().find(".//testcase/failure")
print("" if f is None else f.get("type", ""))' "$out/regress.xml" 2>/dev/null || true)
if [ "$code" != 1 ] || [ "$failure" != regression ]; then
    sed 's/^/   /' "$out/regress.txt"
    echo "container gate failed: an injected regression gave exit $code and failure '$failure', not 1 and 'regression'"
    exit 1
fi
echo "gate inside the container fails an injected regression: exit $code, JUnit failure type $failure ($((SECONDS - t)) s)"

# 4. the service answering from the container -----------------------------------------
t=$SECONDS
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
step "docker run -d --network host $IMAGE serve (127.0.0.1:$port)"
# Host network (dockerd runs with --bridge=none); loopback only. STICKSAT_PORT is also
# what the image's HEALTHCHECK asks; its interval is shortened here, not its command.
container=$("$DOCKER" run -d --network host -e STICKSAT_HOST=127.0.0.1 -e STICKSAT_PORT="$port" \
    --health-interval 2s --health-start-period 60s "$IMAGE" serve --workers 1)
if ! python3 - "$port" "$SUITE/linear_tiny_m16_k64_n128.json" <<'EOF'
import json, sys, time, urllib.error, urllib.request

port, graph_path = int(sys.argv[1]), sys.argv[2]
base = f"http://127.0.0.1:{port}"

def get(path):
    with urllib.request.urlopen(base + path, timeout=5) as resp:
        return resp.status, json.load(resp)

def wait(path, limit):
    deadline, last = time.monotonic() + limit, None
    while time.monotonic() < deadline:
        try:
            return get(path)
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            last = exc
            time.sleep(0.5)
    raise SystemExit(f"{path} did not answer 200 within {limit} s: {last}")

t0 = time.monotonic()
status, body = wait("/healthz", 60)
print(f"   /healthz {status} {json.dumps(body)} after {time.monotonic() - t0:.1f} s")
status, body = wait("/readyz", 120)
print(f"   /readyz {status} {json.dumps(body)} after {time.monotonic() - t0:.1f} s")
with open(graph_path) as f:
    graph = json.load(f)
request = urllib.request.Request(base + "/compile", data=json.dumps({"graph": graph}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
t1 = time.monotonic()
try:
    with urllib.request.urlopen(request, timeout=120) as resp:
        status, body = resp.status, json.load(resp)
except urllib.error.HTTPError as exc:
    raise SystemExit(f"/compile answered {exc.code}: {exc.read()[:2000].decode(errors='replace')}")
program = body.get("program") or {}
if status != 200 or program.get("format") != "sticksat.superdsc" or not program.get("ops"):
    raise SystemExit(f"/compile answered {status} without a program: {json.dumps(body)[:2000]}")
print(f"service answered from the container: /compile {status} in {time.monotonic() - t1:.1f} s, "
      f"graph {graph.get('name', graph_path)}, planner {body['options'].get('planner')}, "
      f"{len(program['ops'])} ops, key {body['key'][:16]}")
EOF
then
    "$DOCKER" logs --tail 40 "$container" 2>&1 | sed 's/^/   container: /'
    echo "container gate failed: the service in the container"
    exit 1
fi
echo "   requests done ($((SECONDS - t)) s)"
health=""
for _ in $(seq 60); do
    health=$("$DOCKER" inspect --format '{{.State.Health.Status}}' "$container")
    [ "$health" = healthy ] && break
    [ "$health" = unhealthy ] && break
    sleep 1
done
uid=$("$DOCKER" exec "$container" python -c 'import os; print(os.getuid())')
echo "   image HEALTHCHECK: $health; the server runs as uid $uid ($((SECONDS - t)) s)"
[ "$health" = healthy ] || { echo "container gate failed: HEALTHCHECK says '$health'"; exit 1; }
"$DOCKER" stop -t 10 "$container" >/dev/null
"$DOCKER" rm -v "$container" >/dev/null
container=""
echo "service stopped ($((SECONDS - t)) s)"

step "passed in $((SECONDS - start)) s"
