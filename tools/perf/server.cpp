// talaria-perf serve: the server process. Opens the layer's transport, listens for the control
// connection, prints one line with both addresses, then serves client sessions: raw baselines
// on request, and layer phases.
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "app.hpp"
#include "backend.hpp"
#include "baseline.hpp"
#include "control.hpp"
#include "talaria/util/log.hpp"
#include "transports.hpp"

namespace talaria::perf {

namespace {

/// Where the control socket listens: explicit, or next to a fixed tcp port (port + 1), or an
/// ephemeral loopback port.
Result<HostPort> ctl_listen_address(const ServeOptions& opt) {
    if (!opt.ctl_listen.empty()) return parse_host_port(opt.ctl_listen);
    if (is_ip_transport(opt.transport) && !opt.listen.empty()) {
        TALARIA_TRY(hp, host_port_of_url(opt.listen));
        if (hp.port != 0 && hp.port != 65535) return HostPort{hp.host, uint16_t(hp.port + 1)};
        return HostPort{hp.host, 0};
    }
    return HostPort{"127.0.0.1", 0};
}

/// One client session: commands until quit, hang-up, or a broken exchange.
Result<void> session(int fd, const ServeOptions& opt, LayerServer* layer,
                     const std::string& layer_error) {
    TALARIA_CHECK(tune_socket(fd, 2 * kPeerTimeout));
    PvmTarget pvm;
    for (;;) {
        auto req = ctl_recv_request(fd);
        if (!req) {
            if (req.code() == Errc::disconnected) return ok();
            return std::move(req).error();
        }
        const CtlRequest& r = *req;
        switch (static_cast<Cmd>(r.cmd)) {
            case Cmd::hello: {
                CtlReply reply;
                set_text(reply.text, sizeof reply.text,
                         fmt::format("layer={} transport={}", opt.layer, opt.transport));
                TALARIA_CHECK(ctl_send(fd, reply));
                break;
            }
            case Cmd::tcp_pingpong:
                TALARIA_CHECK(serve_tcp_pingpong(fd, r));
                break;
            case Cmd::tcp_stream:
                TALARIA_CHECK(serve_tcp_stream(fd, r));
                break;
            case Cmd::shm_pingpong:
                TALARIA_CHECK(serve_shm_pingpong(fd, r));
                break;
            case Cmd::shm_ring:
                TALARIA_CHECK(serve_shm_ring(fd, r));
                break;
            case Cmd::pvm_setup: {
                auto reply = pvm.setup(r);
                TALARIA_CHECK(ctl_send(fd, reply ? *reply : ctl_error(reply.error())));
                break;
            }
            case Cmd::pvm_release:
                pvm.release();
                TALARIA_CHECK(ctl_send(fd, CtlReply{}));
                break;
            case Cmd::layer_enter: {
                std::string name = fixed_text(r.name, sizeof r.name);
                const Layer* asked = find_layer(name);
                const Layer* mine = find_layer(opt.layer);
                if (!asked || !mine || !shares_server(*mine, *asked)) {
                    TALARIA_CHECK(ctl_send(
                        fd, ctl_error(Error(Errc::not_supported,
                                            fmt::format("this server runs layer '{}', not '{}'",
                                                        opt.layer, name)))));
                    break;
                }
                if (!layer) {
                    TALARIA_CHECK(ctl_send(fd, ctl_error(Error(Errc::not_supported, layer_error))));
                    break;
                }
                TALARIA_CHECK(ctl_send(fd, CtlReply{}));
                if (auto p = layer->run_phase(fd); !p)
                    TALARIA_LOG(perf, warn, "serve: {} phase ended with {}", opt.layer,
                                p.error().describe());
                break;
            }
            case Cmd::quit:
                TALARIA_CHECK(ctl_send(fd, CtlReply{}));
                return ok();
        }
    }
}

}  // namespace

int run_serve(const ServeOptions& opt) {
    if (auto f = transport_family(opt.transport); !f) {
        fmt::print(stderr, "talaria-perf serve: --transport (one per server): {}\n",
                   f.error().describe());
        return 2;
    }
    if (opt.cpu >= 0) {
        if (auto p = pin_to_cpu(opt.cpu); !p)
            TALARIA_LOG(perf, warn, "serve: {}", p.error().describe());
    }
    if (opt.realtime > 0) {
        if (auto p = set_realtime(opt.realtime); !p)
            TALARIA_LOG(perf, warn, "serve: {}", p.error().describe());
    }
    const Layer* layer = find_layer(opt.layer);
    if (!layer) {
        fmt::print(stderr, "talaria-perf serve: unknown layer '{}'\n", opt.layer);
        return 2;
    }
    LayerOptions lo;
    lo.thread_safe = opt.thread_safe;
    lo.url = opt.listen;
    if (auto auth = perf_auth(opt.auth_file, opt.protect); auth) {
        lo.auth = std::move(*auth);
        lo.auth_file = opt.auth_file;
        lo.protect = opt.protect;
    } else {
        fmt::print(stderr, "talaria-perf serve: {}\n", auth.error().describe());
        return 2;
    }
    std::unique_ptr<LayerServer> server;
    std::string layer_error;
    if (auto s = layer->make_server(opt.transport, lo); s) {
        server = std::move(*s);
    } else {
        // Keep serving the raw baselines: they do not need the layer.
        layer_error = s.error().describe();
        TALARIA_LOG(perf, warn, "serve: {} over {} unavailable: {}", opt.layer, opt.transport,
                    layer_error);
    }
    auto hp = ctl_listen_address(opt);
    if (!hp) {
        fmt::print(stderr, "talaria-perf serve: {}\n", hp.error().describe());
        return 2;
    }
    auto lfd = tcp_listen(*hp);
    if (!lfd) {
        fmt::print(stderr, "talaria-perf serve: control socket: {}\n", lfd.error().describe());
        return 2;
    }
    auto ctl = local_address(lfd->get());
    if (!ctl) {
        fmt::print(stderr, "talaria-perf serve: {}\n", ctl.error().describe());
        return 2;
    }
    // The one line the client (or a human) reads: key=value, the error last (it has spaces).
    std::string line = fmt::format(
        "talaria-perf-server layer={} transport={} address={} ctl={} "
        "pid={}",
        opt.layer, opt.transport, server ? server->address() : "-", *ctl, ::getpid());
    if (!server) line += " error=" + layer_error;
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);

    for (;;) {
        auto fd = tcp_accept(lfd->get(), opt.once ? kPeerTimeout : Duration(-1));
        if (!fd) {
            fmt::print(stderr, "talaria-perf serve: {}\n", fd.error().describe());
            return 1;
        }
        if (auto s = session(fd->get(), opt, server.get(), layer_error); !s)
            TALARIA_LOG(perf, warn, "serve: session ended: {}", s.error().describe());
        if (opt.once) return 0;
    }
}

}  // namespace talaria::perf
