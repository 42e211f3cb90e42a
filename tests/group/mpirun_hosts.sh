#!/usr/bin/env bash
# One job's ranks on two hosts emulated with network namespaces (issue 13): mpirun runs in host 0
# and starts its daemon in host 1 through an rsh agent that enters host 1's namespace, as ssh
# would on a cluster. Each rank listens on its host's address, so Group::from_pmix sees a job
# over 2 nodes and the ranks call each other across the bridge.
#   mpirun_hosts.sh MPIRUN PEER        (ctest: group/Pmix.AcrossTwoEmulatedHosts)
# Exits 77 (skipped, saying why) where namespaces cannot be made.
set -euo pipefail
mpirun=$1
peer=$2
[ "$(id -u)" -eq 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip > /dev/null || { echo "SKIP: needs iproute2 (apt-get install iproute2)"; exit 77; }
# The hosts are scripts/hosts', under a prefix and a /24 of this test's own.
hosts=$(cd "$(dirname "$0")/../../scripts" && pwd)/hosts
p=tgm$$
export TALARIA_HOSTS_PREFIX=$p TALARIA_HOSTS_NET=10.201.0
dir=$(mktemp -d)
cleanup() {
  "$hosts" down > /dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
if ! ip netns add "$p-probe" 2> /dev/null; then
  echo "SKIP: this kernel or container does not let us make network namespaces"
  exit 77
fi
ip netns del "$p-probe"
"$hosts" up 2 > /dev/null
# The rsh agent: "agent HOST COMMAND..." runs COMMAND (a line for a remote shell) in that host's
# namespace, telling the processes there their host's address.
cat > "$dir/agent" << EOF
#!/bin/sh
host=\$1
shift
case \$host in
  10.201.0.1) ns=$p-h0 ;;
  10.201.0.2) ns=$p-h1 ;;
  *) echo "agent: no emulated host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns env TALARIA_TEST_HOST=\$host sh -c "\$*"
EOF
chmod +x "$dir/agent"
echo "hosts 10.201.0.1 ($p-h0) and 10.201.0.2 ($p-h1); mpirun in the first"
ip netns exec "$p-h0" env TALARIA_TEST_HOST=10.201.0.1 timeout 60 "$mpirun" \
  --allow-run-as-root --oversubscribe --bind-to none \
  --mca plm_rsh_agent "$dir/agent" --mca oob_tcp_if_include eth0 \
  --host 10.201.0.1:2,10.201.0.2:2 -np 4 \
  "$peer" 'tcp://$TALARIA_TEST_HOST:0' sum
