# Sourced by ./swactor and scripts/test.sh: sets DENO to a deno@2.9.6 binary (installing it from the npm
# registry into .tools/ when none is on PATH), installs the npm dependencies pinned in deno.lock into
# node_modules/ when they are missing, and gives WebGPU a runtime dir.
swactor_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
swactor_deno_version="2.9.6"
# The npm package ships the binary in a platform package (@deno/<platform>/deno); its postinstall script
# links it to deno/deno, but npm may be set not to run scripts, so look in both places.
find_tools_deno() {
  local f
  for f in "$swactor_root/.tools/node_modules/deno/deno" "$swactor_root"/.tools/node_modules/@deno/*/deno; do
    if [ -x "$f" ]; then echo "$f"; return 0; fi
  done
  return 1
}
if command -v deno >/dev/null 2>&1; then
  DENO="$(command -v deno)"
elif DENO="$(find_tools_deno)"; then
  :
else
  if ! command -v npm >/dev/null 2>&1; then
    echo "swactor: needs deno on PATH, or npm to install deno@$swactor_deno_version" >&2
    exit 1
  fi
  echo "swactor: installing deno@$swactor_deno_version from the npm registry into .tools/ (once)" >&2
  mkdir -p "$swactor_root/.tools"
  npm install --silent --no-audit --no-fund --prefix "$swactor_root/.tools" "deno@$swactor_deno_version" >&2
  if ! DENO="$(find_tools_deno)"; then
    echo "swactor: npm installed deno@$swactor_deno_version but no binary for this platform was found in .tools/" >&2
    exit 1
  fi
fi
export DENO
if [ ! -f "$swactor_root/node_modules/.swactor-installed" ] \
  || [ "$swactor_root/deno.lock" -nt "$swactor_root/node_modules/.swactor-installed" ]; then
  echo "swactor: installing npm dependencies (deno install --frozen)" >&2
  (cd "$swactor_root" && "$DENO" install --frozen --quiet >&2) && touch "$swactor_root/node_modules/.swactor-installed"
fi
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
  export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/swactor-xdg-$(id -u)"
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi
