#!/usr/bin/env bash
# Bring the chat page's and the console's front-end libraries from npm into static/vendor/, with their licences.
# The output is committed, so `make test` and `make run` never need npm or a CDN; rerun this
# script (and commit static/vendor/) only to change a version.
set -euo pipefail

MARKDOWN_IT=markdown-it@14.1.0
DOMPURIFY=dompurify@3.2.6
HIGHLIGHT=@highlightjs/cdn-assets@11.11.1  # highlight.js's own prebuilt browser bundle
UPLOT=uplot@1.6.32  # the console's time-series charts: ~50 KB, canvas, no dependencies

root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/static/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$work"
npm init -y >/dev/null
npm install --no-audit --no-fund --ignore-scripts "$MARKDOWN_IT" "$DOMPURIFY" "$HIGHLIGHT" "$UPLOT" >/dev/null

rm -rf "$out"
mkdir -p "$out/markdown-it" "$out/dompurify" "$out/highlight" "$out/uplot"
mods="$work/node_modules"
cp "$mods/markdown-it/dist/markdown-it.min.js" "$mods/markdown-it/LICENSE" "$out/markdown-it/"
cp "$mods/dompurify/dist/purify.min.js" "$mods/dompurify/LICENSE" "$out/dompurify/"
cp "$mods/@highlightjs/cdn-assets/highlight.min.js" "$mods/@highlightjs/cdn-assets/LICENSE" "$out/highlight/"
cp "$mods/@highlightjs/cdn-assets/styles/github.min.css" "$out/highlight/"
cp "$mods/@highlightjs/cdn-assets/styles/github-dark.min.css" "$out/highlight/"
cp "$mods/uplot/dist/uPlot.iife.min.js" "$mods/uplot/dist/uPlot.min.css" "$mods/uplot/LICENSE" "$out/uplot/"

{
  echo "Vendored by scripts/vendor_static.sh; do not edit by hand."
  for pkg in markdown-it dompurify @highlightjs/cdn-assets uplot; do
    node -e "const p=require('$mods/$pkg/package.json'); console.log(p.name + ' ' + p.version + ' (' + p.license + ')')"
  done
} > "$out/VERSIONS.txt"
echo "static/vendor/ updated:"; cat "$out/VERSIONS.txt"
