# Sourced by scripts/test.sh, scripts/demo.sh and .ci/run: installs a Debian package when what it
# provides is missing (as root directly, else through sudo).
#   ensure_package PACKAGE HEADER required|optional    a header; nothing happens when CMAKE_PREFIX_PATH
#                                                      is set (the caller provides its own dependencies)
#   ensure_command PACKAGE COMMAND required|optional   a program on PATH (e.g. doxygen)

# install_package PACKAGE required|optional: apt-get install, once more after an update if needed.
install_package() {
  local package=$1 need=$2 sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if $sudo apt-get install -y "$package" || { $sudo apt-get update && $sudo apt-get install -y "$package"; }; then return 0; fi
  [ "$need" = optional ] && { echo "could not install $package: continuing without it"; return 0; }
  return 1
}

ensure_package() {
  local package=$1 header=$2 need=$3
  if [ -f "/usr/include/$header" ] || [ -f "/usr/local/include/$header" ] || [ -n "${CMAKE_PREFIX_PATH:-}" ]; then return 0; fi
  echo "$header not found: installing $package"
  install_package "$package" "$need"
}

ensure_command() {
  local package=$1 command=$2 need=$3
  if command -v "$command" >/dev/null 2>&1; then return 0; fi
  echo "$command not found: installing $package"
  install_package "$package" "$need"
}
