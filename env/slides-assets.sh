#!/usr/bin/env bash
# Install the decks' offline assets (reveal.js, require.js, KaTeX at the versions of slides/package-lock.json)
# into slides/vendor/. npm's cache makes a re-run take about a second. Without node/npm the course still works;
# only `make slides` and the browser test need these files.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S="$ROOT/slides"
if ! command -v npm >/dev/null 2>&1; then
    echo "[slides] WARNING: npm not found: the slide decks cannot be built (install Node.js >= 18, then 'make setup')." >&2
    exit 0
fi
STAMP="$S/vendor/.lock-hash"
WANT=$(sha256sum "$S/package-lock.json" | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
echo "[slides] installing reveal.js, require.js and KaTeX for offline decks"
(cd "$S" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
rm -rf "$S/vendor"; mkdir -p "$S/vendor/reveal.js"
cp -r "$S/node_modules/reveal.js/dist" "$S/node_modules/reveal.js/plugin" "$S/vendor/reveal.js/"
cp "$S/node_modules/requirejs/require.js" "$S/vendor/require.js"
cp -r "$S/node_modules/katex/dist" "$S/vendor/katex"
rm -rf "$S/node_modules"
echo "$WANT" > "$STAMP"
echo "[slides] assets in slides/vendor ($(du -sh "$S/vendor" | cut -f1))"
