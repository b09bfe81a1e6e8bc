#!/usr/bin/env bash
# Check that every public entity of kvsift's API reference is documented: runs doxygen over the public
# headers (docs/Doxyfile.in: include/kvsift/**/*.hpp|*.cuh without detail/ folders and detail
# namespaces) with WARN_IF_UNDOCUMENTED = YES and WARN_NO_PARAMDOC = NO, prints how many public entities
# are undocumented and each one's file:line, and fails when there is any.
#
#   scripts/check-api-docs.sh                  list, and exit 1 when anything is undocumented
#   scripts/check-api-docs.sh --report-only    list, and exit 0 (also: KVSIFT_API_DOCS_REPORT_ONLY=1)
#
# Exit status: 0 all documented (or report-only), 1 undocumented entities, 2 bad usage or doxygen
# failed, 77 doxygen is not installed (ctest reports the docs.api_reference test as skipped).
# DOXYGEN=<path> picks the doxygen binary (default: the one on PATH); `apt-get install doxygen`.
#
# Other doxygen warnings (a malformed command, a \param naming no parameter) are listed too, but do
# not count. Only documented compounds are looked into: a class without a doc comment counts once, and
# its members appear once it is documented, so the count can rise while the documenting goes on.
# Comments must be doxygen comments (`///`, `/** */`, `///<`); plain `//` is not read.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

case "${KVSIFT_API_DOCS_REPORT_ONLY:-0}" in 1|ON|on|YES|yes|true|TRUE) report_only=1 ;; *) report_only=0 ;; esac
for arg in "$@"; do
  case "$arg" in
    --report-only) report_only=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-api-docs: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

doxygen="${DOXYGEN:-}"
if [ -z "$doxygen" ] || ! [ -x "$doxygen" ]; then doxygen="$(command -v doxygen || true)"; fi
if [ -z "$doxygen" ]; then
  echo "check-api-docs: doxygen not found (Debian/Ubuntu: apt-get install doxygen): skipped"
  exit 77
fi

version="$(sed -n 's/^#define KVSIFT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9][0-9]*\).*/\2/p' \
  "$root/include/kvsift/version.hpp" | paste -sd. -)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Doxygen checks a free function or macro only when its namespace or file is documented, and says
# nothing about an undocumented namespace or file. So this script reports those itself, and for the
# check run writes stand-in \file / \namespace comments for them (not in the real reference) so that
# their members are checked too.
mkdir -p "$tmp/stubs"
: > "$tmp/structure.txt"
headers=()
while IFS= read -r h; do headers+=("$h"); done < <(cd "$root" && find include/kvsift -type f \( -name '*.hpp' -o -name '*.cuh' \) \
  -not -path '*/detail/*' | LC_ALL=C sort)
for h in "${headers[@]}"; do
  if ! grep -qE '[\\@]file([[:space:]]|$)' "$root/$h"; then
    echo "$h:1: File ${h#include/} has no \\file comment (say what the header holds)" >> "$tmp/structure.txt"
    printf '/** \\file %s\n \\brief (stand-in for the check) */\n' "${h#include/}" >> "$tmp/stubs/stubs.dox"
  fi
done
# Namespaces opened in the public headers (`namespace X {`; X other than kvsift is taken to be
# kvsift::X), detail namespaces excepted.
while IFS=: read -r h line ns; do
  case "$ns" in *detail*) continue ;; kvsift|kvsift::*) q="$ns" ;; *) q="kvsift::$ns" ;; esac
  grep -qF " $q " "$tmp/namespaces.seen" 2>/dev/null && continue
  echo " $q " >> "$tmp/namespaces.seen"
  if ! grep -rqE "[\\@]namespace[[:space:]]+$q([[:space:]]|\$)" "$root/include/kvsift" "$root/docs/api"; then
    echo "$h:$line: Namespace $q is not documented (no \\namespace $q comment in include/ or docs/api/)" >> "$tmp/structure.txt"
    printf '/** \\namespace %s\n \\brief (stand-in for the check) */\n' "$q" >> "$tmp/stubs/stubs.dox"
  fi
done < <(cd "$root" && grep -HnE '^[[:space:]]*namespace [A-Za-z_][A-Za-z_0-9:]* *\{' "${headers[@]}" |
           sed -E 's/^([^:]+):([0-9]+):[[:space:]]*namespace ([A-Za-z_0-9:]+).*/\1:\2:\3/')

# The same template as the docs target, with the checks switched on and no output but the warnings.
sed -e "s|@PROJECT_SOURCE_DIR@|$root|g" -e "s|@PROJECT_VERSION@|$version|g" \
    -e "s|@KVSIFT_DOCS_OUTPUT_DIR@|$tmp/out|g" "$root/docs/Doxyfile.in" > "$tmp/Doxyfile"
cat >> "$tmp/Doxyfile" <<EOF
WARN_IF_UNDOCUMENTED   = YES
WARN_NO_PARAMDOC       = NO
WARN_LOGFILE           = $tmp/warnings.log
INPUT                 += $tmp/stubs
GENERATE_HTML          = NO
GENERATE_TREEVIEW      = NO
SEARCHENGINE           = NO
QUIET                  = YES
EOF
if ! "$doxygen" "$tmp/Doxyfile" > "$tmp/doxygen.out" 2>&1; then
  cat "$tmp/doxygen.out" "$tmp/warnings.log" 2>/dev/null || true
  echo "check-api-docs: doxygen ($doxygen) failed" >&2
  exit 2
fi

# One warning per line from here on: "<abs path>:<line>: warning: <text>" (continuation lines of a
# multi-line warning are kept with the line before).
awk '/^[^ \t].*:[0-9]+: (warning|error): /{ if (w != "") print w; w = $0; next } { if (w != "") w = w " " $0 }
     END { if (w != "") print w }' "$tmp/warnings.log" |
  sed "s|^$root/||" > "$tmp/all.txt" || true
grep -E ': (warning|error): .*is not documented' "$tmp/all.txt" |
  sed -E 's/: (warning|error): /: /' | sort -t: -k1,1 -k2,2n -u > "$tmp/undocumented.txt" || true
cat "$tmp/structure.txt" >> "$tmp/undocumented.txt"
sort -t: -k1,1 -k2,2n -u -o "$tmp/undocumented.txt" "$tmp/undocumented.txt"
grep -vE ': (warning|error): .*is not documented' "$tmp/all.txt" | grep -vF "$tmp/stubs" |
  sort -t: -k1,1 -k2,2n -u > "$tmp/other.txt" || true
n_undoc=$(wc -l < "$tmp/undocumented.txt")
n_other=$(wc -l < "$tmp/other.txt")

if [ "$n_other" -gt 0 ]; then
  echo "check-api-docs: $n_other other doxygen warning(s) (reported, not counted):"
  sed 's/^/  /' "$tmp/other.txt"
fi
if [ "$n_undoc" -gt 0 ]; then
  echo "check-api-docs: $n_undoc undocumented public entit$([ "$n_undoc" = 1 ] && echo y || echo ies):"
  sed 's/^/  /' "$tmp/undocumented.txt"
  echo "check-api-docs: $n_undoc undocumented public entit$([ "$n_undoc" = 1 ] && echo y || echo ies) in include/kvsift (detail/ excluded)"
  if [ "$report_only" = 1 ]; then
    echo "check-api-docs: report-only mode: not failing"
    exit 0
  fi
  exit 1
fi
echo "check-api-docs: every public entity in include/kvsift is documented (doxygen $("$doxygen" --version))"
