# Sourced by .ci/run (as root, under `set -euo pipefail`): install Debian's Docker engine
# and debootstrap, start dockerd (vfs storage, no iptables, no bridge: it runs inside a
# sandbox without a registry or NAT) and export STICKSAT_DOCKER=1 once `docker info`
# answers. Anything that fails here only skips the container gate (.ci/container.sh
# prints the reason); it never fails the test run. Idempotent: an engine already
# answering is reused.
_sticksat_docker_setup() {
    local log=${STICKSAT_DOCKERD_LOG:-/var/log/sticksat-dockerd.log}
    local docker=/usr/bin/docker
    if [ "$(id -u)" != 0 ]; then
        echo "container gate skipped: .ci/setup/docker.sh needs root to install and start dockerd"
        return 1
    fi
    if ! command -v dockerd >/dev/null 2>&1 || [ ! -x "$docker" ] || ! command -v debootstrap >/dev/null 2>&1; then
        echo "== docker: apt-get install docker.io debootstrap"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
               && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                    docker.io debootstrap ca-certificates curl >/dev/null; }; then
            echo "container gate skipped: apt-get install docker.io debootstrap failed"
            return 1
        fi
    fi
    if ! "$docker" info >/dev/null 2>&1; then
        echo "== docker: starting dockerd (vfs, no iptables, no bridge), log $log"
        # setsid: its own session, so the CI shell's job control never signals it.
        setsid dockerd --storage-driver vfs --iptables=false --ip6tables=false --bridge=none \
            >>"$log" 2>&1 < /dev/null &
        local pid=$! waited=0 limit=${STICKSAT_DOCKERD_WAIT_S:-60}
        until "$docker" info >/dev/null 2>&1; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "container gate skipped: dockerd exited at start; last lines of $log:"
                tail -n 20 "$log" || true
                return 1
            fi
            if [ "$waited" -ge "$limit" ]; then
                echo "container gate skipped: dockerd did not answer within $limit s (stopped); last lines of $log:"
                tail -n 20 "$log" || true
                kill "$pid" 2>/dev/null || true
                return 1
            fi
            sleep 1
            waited=$((waited + 1))
        done
        echo "== docker: dockerd answers after ${waited} s"
    fi
    echo "== docker: $("$docker" version --format 'engine {{.Server.Version}}, storage driver ' 2>/dev/null)$("$docker" info --format '{{.Driver}}' 2>/dev/null)"
    return 0
}
if _sticksat_docker_setup; then
    export STICKSAT_DOCKER=1
else
    export STICKSAT_DOCKER=0
fi
unset -f _sticksat_docker_setup
