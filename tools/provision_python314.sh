#!/usr/bin/env bash
# Provision CPython 3.14 from Debian testing into a private folder, for CI and nox on a
# Debian whose own packages stop at 3.11 (docs/guides/installation.md).
#
#   tools/provision_python314.sh [FOLDER]     # default: $TMPDIR/dispatch-async-python3.14
#
# Ends with FOLDER/usr/bin/python3.14, which noxfile.py puts on PATH. Nothing of the
# machine changes: apt reads a sources list, package lists and a download cache of its own
# in FOLDER/apt (the machine's packages keep coming from its own sources), and the
# packages are unpacked with dpkg-deb into FOLDER, never installed.
#
# Testing's python3.14 needs testing's C library, newer than the machine's, and that
# library must be loaded by its own dynamic loader. The interpreter is made to name that
# loader (PT_INTERP) and its libraries ($ORIGIN/../lib, a DT_RPATH: extension modules
# loaded later search it too) with patchelf, itself from testing and started through the
# same loader. A real executable rather than a script that execs the loader: a virtual
# environment links its python to the base interpreter's file, uv runs that file to
# inspect it, and the tests start sys.executable; each of those would bypass a script.
# Not a link to it either: a virtual environment made through a link finds no standard
# library. The folder cannot move afterwards (the loader's path is absolute).
#
# Run again, it does nothing when FOLDER/usr/bin/python3.14, or a python3.14 on PATH, runs. On failure it
# prints one line that says what failed (the details are in FOLDER/provision.log) and
# exits 1.
set -euo pipefail

folder="${1:-${TMPDIR:-/tmp}/dispatch-async-python3.14}"
folder="$(mkdir -p "$folder" && cd "$folder" && pwd)"
python="$folder/usr/bin/python3.14"
log="$folder/provision.log"

# A python3.14 on PATH is the one nox takes: nothing to do.
for ready in "$python" python3.14; do
  if "$ready" -c 'import ssl, sqlite3, venv, ensurepip' >/dev/null 2>&1; then
    exit 0
  fi
done

fail() {
  echo "provision_python314: $1 (details: $log)" >&2
  exit 1
}

# The interpreter and the standard library, venv with the pip wheel ensurepip installs,
# and patchelf; with everything they depend on, save what a Debian system always has and
# that a program never loads (debconf's).
wanted=(python3.14-minimal libpython3.14-minimal libpython3.14-stdlib python3.14-venv
  python3-pip-whl patchelf)
never='^(debconf|cdebconf|libdebian-installer4|libnewt0\.52|libslang2|libtextwrap1)$'

rm -rf "$folder/apt" "$folder/debs" "$folder/etc" "$folder/usr"
mkdir -p "$folder/apt/lists/partial" "$folder/apt/cache/archives/partial" \
  "$folder/apt/sources.list.d" "$folder/debs"
: >"$log"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
  "http://deb.debian.org/debian testing main" >"$folder/apt/sources.list"
apt_options=(
  -o "Dir::Etc::SourceList=$folder/apt/sources.list"
  -o "Dir::Etc::SourceParts=$folder/apt/sources.list.d"
  -o "Dir::State::Lists=$folder/apt/lists"
  -o "Dir::Cache=$folder/apt/cache"
  -o "APT::Sandbox::User=root"
)

apt-get "${apt_options[@]}" update >>"$log" 2>&1 \
  || fail "apt-get update of Debian testing failed: $(tail -n 1 "$log")"
packages="$(apt-cache "${apt_options[@]}" depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "${wanted[@]}" 2>>"$log" \
  | grep -v '^[ <]' | grep -Ev "$never" | sort -u)" \
  || fail "apt-cache could not list what ${wanted[*]} depend on"
# shellcheck disable=SC2086  # one package a word
(cd "$folder/debs" && apt-get "${apt_options[@]}" download $packages >>"$log" 2>&1) \
  || fail "apt-get download from Debian testing failed: $(tail -n 1 "$log")"
for deb in "$folder"/debs/*.deb; do
  dpkg-deb -x "$deb" "$folder" >>"$log" 2>&1 || fail "dpkg-deb could not unpack $deb"
done

libs="$folder/usr/lib/x86_64-linux-gnu"
loader="$libs/ld-linux-x86-64.so.2"
[ -x "$loader" ] && [ -x "$python" ] || fail "the unpacked packages hold no $loader or $python"
patchelf=("$loader" --library-path "$libs" "$folder/usr/bin/patchelf")
# Two calls, the rpath first: patchelf 0.18 given both at once (or an absolute rpath)
# writes an interpreter that crashes at start.
{ "${patchelf[@]}" --force-rpath --set-rpath '$ORIGIN/../lib/x86_64-linux-gnu' "$python" \
  && "${patchelf[@]}" --set-interpreter "$loader" "$python"; } >>"$log" 2>&1 \
  || fail "patchelf could not point python3.14 at its own loader"
# ensurepip takes pip from the folder the build names; its wheel is unpacked here instead.
sed -i "s|'WHEEL_PKG_DIR': '/usr/share/python-wheels/'|'WHEEL_PKG_DIR': '$folder/usr/share/python-wheels/'|" \
  "$folder"/usr/lib/python3.14/_sysconfigdata_*.py
grep -qs "'WHEEL_PKG_DIR': '$folder/" "$folder"/usr/lib/python3.14/_sysconfigdata_*.py \
  || fail "no WHEEL_PKG_DIR in python3.14's sysconfig data to point at the unpacked pip wheel"
# What else is in usr/bin would be on PATH beside python3.14: testing's openssl, which the
# machine's loader cannot start, and patchelf, done with.
rm -f "$folder/usr/bin/openssl" "$folder/usr/bin/patchelf"
"$python" -c 'import ssl, sqlite3, venv, ensurepip' >>"$log" 2>&1 \
  || fail "the provisioned python3.14 does not start: $(tail -n 1 "$log")"
# The standard library compiled to bytecode, as Debian's installation would (py3compile,
# which dpkg-deb -x does not run): where PYTHONDONTWRITEBYTECODE is set, every process
# otherwise compiles each module of it that it imports again, and each one a test starts
# took twice as long (measured: 1.40 s against 0.68 s for `dispatch-async --version`).
"$python" -m compileall -q -j 0 "$folder/usr/lib/python3.14" >>"$log" 2>&1 \
  || fail "python3.14 could not compile its standard library: $(tail -n 1 "$log")"
rm -rf "$folder/debs" "$folder/apt/cache"
echo "provision_python314: $("$python" -VV | head -n 1) in $folder/usr/bin" >&2
