# Sourced by scripts/test.sh, scripts/demo.sh and .ci/run: installs a Debian package when its header is
# missing (as root directly, else through sudo). Nothing happens when CMAKE_PREFIX_PATH is set: the
# caller then provides its own dependencies.
#   ensure_package PACKAGE HEADER required|optional
ensure_package() {
  local package=$1 header=$2 need=$3
  if [ -f "/usr/include/$header" ] || [ -f "/usr/local/include/$header" ] || [ -n "${CMAKE_PREFIX_PATH:-}" ]; then return 0; fi
  echo "$header not found: installing $package"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if $sudo apt-get install -y "$package" || { $sudo apt-get update && $sudo apt-get install -y "$package"; }; then return 0; fi
  [ "$need" = optional ] && { echo "could not install $package: continuing without it"; return 0; }
  return 1
}

# ensure_command PACKAGE COMMAND required|optional: the same for a program (e.g. doxygen), found on PATH.
ensure_command() {
  local package=$1 command=$2 need=$3
  if command -v "$command" >/dev/null 2>&1; then return 0; fi
  echo "$command not found: installing $package"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if $sudo apt-get install -y "$package" || { $sudo apt-get update && $sudo apt-get install -y "$package"; }; then return 0; fi
  [ "$need" = optional ] && { echo "could not install $package: continuing without it"; return 0; }
  return 1
}
