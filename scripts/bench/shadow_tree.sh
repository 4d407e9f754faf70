#!/usr/bin/env bash
# Prints a folder to put on PYTHONPATH so that `import multidev` takes every module from checkout TREE:
# its multidev/ copied, with the folders pyproject.toml maps into the package (backends/ as
# multidev.adapters, benchmarks/, conformance_tests/, examples/) linked inside it. PYTHONPATH=TREE alone is
# not enough: the interpreter's editable install of another checkout answers for those mapped folders.
#   PYTHONPATH=$(bash scripts/bench/shadow_tree.sh /path/to/old/checkout) python ...
set -euo pipefail
TREE=$(cd "$1" && pwd)
DEST=${TMPDIR:-/tmp}/multidev-shadow-$(echo "$TREE" | cksum | cut -d' ' -f1)
rm -rf "$DEST" && mkdir -p "$DEST"
cp -r "$TREE/multidev" "$DEST/multidev"
for pair in adapters:backends benchmarks:benchmarks conformance:conformance_tests examples:examples; do
  [ -d "$TREE/${pair#*:}" ] && ln -s "$TREE/${pair#*:}" "$DEST/multidev/${pair%%:*}"
done
echo "$DEST"
