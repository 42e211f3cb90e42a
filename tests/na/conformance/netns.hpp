// Hosts emulated on this machine for tests (issue 13, part 1): network namespaces joined by a
// bridge, each with its own address, so that two processes talk over a real (virtual) network
// and not over the loopback device. Nothing is added to the namespace the test itself runs in.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace talaria::na::test {

/// `n` network namespaces ("hosts"). Host i has `lo` and `eth0` at 10.200.0.(i+1)/24, the other
/// end of a veth pair whose peer is a port of bridge `br0` in one more namespace of their own,
/// so the addresses never meet those of the machine. Made with iproute2 (`ip`), as root.
///
/// Names are `tlr<pid>-<k>-h<i>` and `tlr<pid>-<k>-br` (k counts the sets of this process). The
/// destructor removes them (which removes the veth pairs and the bridge). A test killed before
/// its destructor ran leaves them behind: the next Hosts::create of any process removes the
/// namespaces named after a process that no longer runs.
class Hosts {
  public:
    /// The hosts, or null with `*why` saying what is missing (not root, no `ip`, namespaces or
    /// veth refused by the kernel): a test skips with that message.
    static std::unique_ptr<Hosts> create(int n, std::string* why);

    Hosts(const Hosts&) = delete;
    Hosts& operator=(const Hosts&) = delete;
    ~Hosts();

    /// Host i's IPv4 address (no prefix length).
    [[nodiscard]] std::string ip(int i) const;
    /// Host i's namespace name (`ip netns exec NAME ...`).
    [[nodiscard]] const std::string& name(int i) const { return names_[std::size_t(i)]; }
    /// A descriptor of host i's namespace, for setns(2) (PeerProcess::spawn's netns_fd).
    [[nodiscard]] int fd(int i) const { return fds_[std::size_t(i)]; }
    [[nodiscard]] int size() const { return int(names_.size()); }

    /// Remove the namespaces of this kind whose process is gone (done by create()).
    static void remove_stale();

  private:
    Hosts() = default;
    std::string bridge_;
    std::vector<std::string> names_;
    std::vector<int> fds_;
};

}  // namespace talaria::na::test
