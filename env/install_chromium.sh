#!/usr/bin/env bash
# Make sure a headless Chromium exists (for `make slides` PDFs and the browser test).
# Debian/Ubuntu as root: installs Debian's chromium package (about 30 s). Otherwise says what to do.
set -euo pipefail
for c in "${DDLCOURSE_CHROMIUM:-}" chromium chromium-browser google-chrome; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[chromium] installing Debian's chromium package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null
    command -v chromium >/dev/null && exit 0
fi
echo "[chromium] no Chromium found: install it (Debian/Ubuntu: sudo apt-get install chromium) or set DDLCOURSE_CHROMIUM" >&2
exit 1
