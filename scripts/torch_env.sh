# Sourced by setup.sh, build.sh and the GPU bundle: where spes's libtorch (the PyPI torch wheel)
# lives. Override SPES_TORCH_VERSION to build against another release (docs/build.md lists those
# built); SPES_TORCH_HOME to put it elsewhere.
SPES_TORCH_VERSION=${SPES_TORCH_VERSION:-2.11.0}
SPES_TORCH_HOME=${SPES_TORCH_HOME:-/opt/spes/torch-$SPES_TORCH_VERSION}
SPES_TRANSFORMERS_VERSION=${SPES_TRANSFORMERS_VERSION:-5.25.0}
# site-packages of the venv (python3.X varies with the machine's Debian python).
spes_torch_site() {
  local d
  for d in "$SPES_TORCH_HOME"/lib/python3*/site-packages; do
    [ -d "$d/torch" ] && { echo "$d"; return 0; }
  done
  echo "spes: no torch under $SPES_TORCH_HOME: run scripts/setup.sh" >&2
  return 1
}
