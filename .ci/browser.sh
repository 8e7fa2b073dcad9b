#!/usr/bin/env bash
# Headless Chromium for the dashboard's browser test: Debian's package, installed where it
# is missing (about 48 s on a 2-core machine). Progress on stderr.
set -euo pipefail
command -v chromium >/dev/null && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q chromium >&2 ||
    { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q chromium >&2; }
command -v chromium >/dev/null || { echo "chromium is not on PATH after its install" >&2; exit 1; }
