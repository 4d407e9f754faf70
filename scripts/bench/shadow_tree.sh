#!/usr/bin/env bash
# Prints a new folder to put on PYTHONPATH so that `import multidev` takes every module from checkout
# TREE: its multidev/ copied, the folders its pyproject.toml maps into the package (backends/ as
# multidev.adapters, benchmarks/, conformance_tests/, examples/) linked inside it, and a
# sitecustomize.py that takes the interpreter's editable finder off sys.meta_path (that finder maps
# those folders to the installed checkout: a module TREE lacks would silently come from there).
#   PYTHONPATH=$(bash scripts/bench/shadow_tree.sh /path/to/old/checkout) python ...
set -euo pipefail
TREE=$(cd "$1" && pwd)
DEST=$(mktemp -d "${TMPDIR:-/tmp}/multidev-shadow-XXXXXX")
cp -r "$TREE/multidev" "$DEST/multidev"
# the mapping as TREE's pyproject.toml states it ("multidev.NAME" = "FOLDER")
sed -n '/^\[tool.setuptools.package-dir\]/,/^\[/p' "$TREE/pyproject.toml" \
  | sed -n 's/^"multidev\.\([a-z_]*\)" *= *"\([A-Za-z_]*\)".*/\1 \2/p' | while read -r name folder; do
  [ -d "$TREE/$folder" ] || { echo "shadow_tree: $TREE has no $folder/ (mapped to multidev.$name)" >&2; exit 1; }
  ln -s "$TREE/$folder" "$DEST/multidev/$name"
done
cat > "$DEST/sitecustomize.py" <<'PYEOF'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")
                    and "__editable__" not in type(f).__module__ and "__editable__" not in repr(f)]
PYEOF
echo "$DEST"
