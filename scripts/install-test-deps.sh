#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine:
#   nginx (Debian's nginx-light): the real HTTP range server the HTTP tests start on 127.0.0.1.
# Idempotent: does nothing when everything is present.
set -euo pipefail

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-test-deps: apt-get install ${need_apt[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
echo "install-test-deps: nginx $(/usr/sbin/nginx -v 2>&1 | sed 's/.*nginx\///')" >&2
