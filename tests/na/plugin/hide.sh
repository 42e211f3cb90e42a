#!/bin/sh
# Runs "$@" where the libraries named in $HIDE (paths, separated by ':') cannot be loaded, as on a
# machine without libfabric and UCX: in a private mount namespace, an empty file is bind-mounted
# over each (the real file behind any symlink), so the dynamic linker finds a file too short to
# be a shared object. Exits 77 (ctest: skipped) where mount namespaces are not allowed.
set -eu
empty=$(mktemp)
trap 'rm -f "$empty"' EXIT
targets=""
old_ifs=$IFS
IFS=':'
for lib in $HIDE; do
  [ -e "$lib" ] && targets="$targets $(readlink -f "$lib")"
done
IFS=$old_ifs
if ! unshare --mount true 2>/dev/null; then
  echo "SKIPPED: this process may not create a mount namespace (unshare --mount: needs root or" \
       "CAP_SYS_ADMIN), so libfabric and UCX cannot be hidden here"
  exit 77
fi
rc=0
# shellcheck disable=SC2016
unshare --mount sh -c '
  empty=$1; shift; targets=$1; shift
  for t in $targets; do
    if ! mount --bind "$empty" "$t"; then
      echo "SKIPPED: mount --bind over $t is not allowed here (a container or security" \
           "module forbids it), so libfabric and UCX cannot be hidden"
      exit 77
    fi
    echo "hidden: $t"
  done
  exec "$@"' hide "$empty" "$targets" "$@" || rc=$?
exit $rc
