# Headless Chromium for tests/test_browser.py (issue 17): Debian's `chromium` package.
# Sourced by .ci/run (as root, under `set -euo pipefail`): exports STICKSAT_CHROMIUM when
# a browser that starts is there, else says why the browser test will skip. Never fails
# the run and never exits (it is sourced).
_sticksat_setup_chromium() {
    local bin log profile dom
    bin="$(command -v chromium || true)"
    if [ -z "$bin" ]; then
        if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
            echo "ci setup: chromium is not installed and cannot be (needs root and apt-get):" \
                 "tests/test_browser.py will skip"
            return 0
        fi
        log="$(mktemp)"
        echo "ci setup: installing Debian's chromium (apt-get, quiet; log $log)"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                --no-install-recommends chromium fonts-dejavu-core; } >"$log" 2>&1; then
            tail -n 5 "$log" || true
            echo "ci setup: apt-get install chromium failed: tests/test_browser.py will skip"
            return 0
        fi
        bin="$(command -v chromium || true)"
    fi
    # It must start headless here, not just be installed: load an empty page once.
    profile="$(mktemp -d)"
    dom=""
    if [ -n "$bin" ]; then
        dom="$(timeout 120 "$bin" --headless --no-sandbox --disable-gpu --no-first-run \
            --disable-background-networking --disable-component-update --disable-sync \
            --user-data-dir="$profile" --dump-dom about:blank 2>/dev/null || true)"
    fi
    rm -rf "$profile"
    if [[ "$dom" != *"<body"* ]]; then
        if [ -z "$bin" ]; then
            echo "ci setup: chromium not found after installing it: tests/test_browser.py will skip"
        else
            echo "ci setup: chromium $bin does not start headless (--dump-dom about:blank gave no page):" \
                 "STICKSAT_CHROMIUM not set; tests/test_browser.py finds it on PATH and fails with the browser's error"
        fi
        return 0
    fi
    export STICKSAT_CHROMIUM="$bin"
    echo "ci setup: STICKSAT_CHROMIUM=$STICKSAT_CHROMIUM ($("$bin" --version 2>/dev/null | head -n 1))"
}
_sticksat_setup_chromium
unset -f _sticksat_setup_chromium
