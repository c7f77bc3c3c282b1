#!/usr/bin/env bash
# pip install . in a fresh virtual environment (Debian's Python, its site packages visible, no
# network): the package builds its compiled core through CMake (setup.py), then imports, predicts
# through the API and through `python -m membudget`, from outside the checkout. ctest runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build/pip-check}
rm -rf "$work/venv"
mkdir -p "$work"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
cd "$root"
"$work/venv/bin/pip" install --no-build-isolation --no-index --no-deps -q .
cd "$work"
venv/bin/python -c "import membudget, sys; p = membudget.predict('$root/configs/llama-3.2-1b.yaml');
assert membudget.__file__.startswith('$work/venv'), membudget.__file__
print('import membudget:', membudget.__file__, 'peak', p['peak'])"
venv/bin/python -m membudget predict "$root/configs/llama-3.2-1b.yaml" | head -1
venv/bin/python -m membudget predict "$root/configs/llama-3.2-1b.yaml" --format json > predict.json
venv/bin/python -c "import json; assert json.load(open('predict.json'))['peak'] > 0"
echo "pip install . ok"
