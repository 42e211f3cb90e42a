// Mercury's C API and Talaria's C++ API in one process, over the transport named by argv[1] (a
// Mercury info string): a procedure registered with HG_Register_name is called through
// talaria::Engine::remote, one defined with talaria::Engine::define is called with HG_Forward,
// for arguments whose encodings agree (fixed-width integers back to back: a Mercury struct of a
// uint32_t and a uint64_t is the C++ arguments (uint32_t, uint64_t)). A client procedure
// registered by name also reaches a server that registered the name's Mercury id by number
// (HG_Register), and then the C++ engine again. The talaria::Engine under an HG class
// (talaria::mercury::engine) defines a procedure served by the class's HG_Progress/HG_Trigger
// thread, and waits in get() for its own calls and a pull while that thread progresses the same
// context; over an NA class with no context to spare its pull answers not_supported. Each check
// says what failed; the status is the count.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "mercury.h"
#include "mercury_proc.h"
#include "mercury_talaria.hpp"
#include "na.h"
#include "talaria/talaria.hpp"

namespace {

struct pair_in_t {
    hg_uint32_t a;
    hg_uint64_t b;
};

hg_return_t hg_proc_pair_in_t(hg_proc_t proc, void* data) {
    auto* in = static_cast<pair_in_t*>(data);
    hg_return_t ret = hg_proc_hg_uint32_t(proc, &in->a);
    return ret != HG_SUCCESS ? ret : hg_proc_hg_uint64_t(proc, &in->b);
}
hg_return_t hg_proc_u64(hg_proc_t proc, void* data) {
    return hg_proc_hg_uint64_t(proc, static_cast<hg_uint64_t*>(data));
}

std::atomic<int> served{0}, undecodable{0};

/// "mix" at the HG server: a * 1000 + b.
hg_return_t on_mix(hg_handle_t h) {
    pair_in_t in{};
    hg_return_t ret = HG_Get_input(h, &in);
    if (ret != HG_SUCCESS) {  // input that is not a pair_in_t: dropped unanswered
        ++undecodable;
        HG_Destroy(h);
        return ret;
    }
    hg_uint64_t out = uint64_t(in.a) * 1000 + in.b;
    HG_Free_input(h, &in);
    ++served;
    ret = HG_Respond(h, nullptr, nullptr, &out);
    CHECK(ret == HG_SUCCESS, "HG_Respond to a C++ caller");
    HG_Destroy(h);
    return HG_SUCCESS;
}

struct Waiter {
    hg_context_t* ctx;
    bool done = false;  // set by the callback, in this thread's HG_Trigger
    hg_return_t ret = HG_OTHER_ERROR;
    hg_uint64_t out = 0;
};

hg_return_t on_forwarded(const hg_cb_info* info) {
    auto* w = static_cast<Waiter*>(info->arg);
    w->ret = info->ret;
    if (info->ret == HG_SUCCESS) {
        hg_handle_t h = info->info.forward.handle;
        if (HG_Get_output(h, &w->out) == HG_SUCCESS)
            HG_Free_output(h, &w->out);
        else
            w->ret = HG_PROTOCOL_ERROR;
    }
    w->done = true;
    return HG_SUCCESS;
}

/// Forward `in` with `id` to `addr` on `ctx` and progress until its callback ran (10 s at most).
Waiter call(hg_context_t* ctx, hg_addr_t addr, hg_id_t id, pair_in_t in) {
    Waiter w{ctx, false, HG_OTHER_ERROR, 0};
    hg_handle_t h = HG_HANDLE_NULL;
    if (HG_Create(ctx, addr, id, &h) != HG_SUCCESS) return w;
    if (HG_Forward(h, on_forwarded, &w, &in) == HG_SUCCESS) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!w.done && std::chrono::steady_clock::now() < end) {
            unsigned n = 0;
            HG_Progress(ctx, 10);
            HG_Trigger(ctx, 0, 16, &n);
        }
    }
    HG_Destroy(h);
    return w;
}

/// A thread looping HG_Progress and HG_Trigger on a server's context until stopped.
class ProgressThread {
  public:
    explicit ProgressThread(hg_context_t* ctx)
        : thread_([this, ctx] {
              while (!stop_) {
                  unsigned n = 0;
                  HG_Progress(ctx, 10);
                  HG_Trigger(ctx, 0, 16, &n);
              }
          }) {}
    ~ProgressThread() { stop(); }
    void stop() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
    }
    [[nodiscard]] std::thread::id id() const { return thread_.get_id(); }

  private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

/// The address string a talaria::Engine looks a Mercury address up by ("na+" dropped).
std::string talaria_address(hg_class_t* cls) {
    hg_addr_t self = HG_ADDR_NULL;
    char buf[512];
    hg_size_t size = sizeof buf;
    if (HG_Addr_self(cls, &self) != HG_SUCCESS) return {};
    hg_return_t ret = HG_Addr_to_string(cls, buf, &size, self);
    HG_Addr_free(cls, self);
    if (ret != HG_SUCCESS) return {};
    std::string s(buf);
    return s.starts_with("na+") ? s.substr(3) : s;
}

/// The C++ engine's address for `info`'s transport: Talaria's string of Mercury's.
std::string engine_url(const std::string& info) {
    std::string s = info.starts_with("na+") ? info.substr(3) : info;
    if (s == "sm") s = "sm://";
    return s;
}

/// Read a line (an address) from `fd`, 10 s at most; empty when none came.
std::string read_line(int fd) {
    std::string line;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    char c = 0;
    while (std::chrono::steady_clock::now() < end) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) != 1) continue;
        if (::read(fd, &c, 1) != 1 || c == '\n') return c == '\n' ? line : std::string{};
        line += c;
    }
    return {};
}

/// True once the other end of `fd` was closed (the parent is done with this child).
bool closed(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
}

/// Both directions across two processes: a forked child serves "mix" through the C API and a
/// C++ client in this process calls it, then the child is a C++ server that an HG client here
/// forwards to. The child writes its address to a pipe and serves until this end closes the
/// other pipe; its exit status is its own failure count.
int two_processes(const std::string& info) {
    using namespace std::chrono_literals;
    for (const bool hg_server : {true, false}) {
        int addr_pipe[2], stop_pipe[2];
        if (::pipe(addr_pipe) != 0 || ::pipe(stop_pipe) != 0) return 1;
        const pid_t pid = ::fork();
        if (pid < 0) return 1;
        if (pid == 0) {  // the server: nothing was opened in this process before the fork
            ::close(addr_pipe[0]);
            ::close(stop_pipe[1]);
            if (hg_server) {
                hg_class_t* cls = HG_Init(info.c_str(), HG_TRUE);
                CHECK(cls != nullptr, "HG_Init of the server in the child");
                if (!cls) ::_exit(failures);
                hg_context_t* ctx = HG_Context_create(cls);
                CHECK(HG_Register_name(cls, "mix", hg_proc_pair_in_t, hg_proc_u64, on_mix) != 0,
                      "HG_Register_name in the child");
                const std::string line = talaria_address(cls) + "\n";
                CHECK(::write(addr_pipe[1], line.data(), line.size()) == ssize_t(line.size()),
                      "the child's address written");
                while (!closed(stop_pipe[0])) {
                    unsigned n = 0;
                    HG_Progress(ctx, 10);
                    HG_Trigger(ctx, 0, 16, &n);
                }
                CHECK(served == 20, "the HG server in the child served the 20 C++ calls");
                CHECK(HG_Context_destroy(ctx) == HG_SUCCESS, "HG_Context_destroy in the child");
                CHECK(HG_Finalize(cls) == HG_SUCCESS, "HG_Finalize in the child");
            } else {
                talaria::Engine server{engine_url(info), talaria::listen};
                server.define("mix", [](uint32_t a, uint64_t b) { return uint64_t(a) * 1000 + b; });
                std::string where = server.self_address();
                if (info.starts_with("na+")) where = "na+" + where;
                where += "\n";
                CHECK(::write(addr_pipe[1], where.data(), where.size()) == ssize_t(where.size()),
                      "the child's address written");
                while (!closed(stop_pipe[0]))
                    std::this_thread::sleep_for(10ms);
            }
            ::_exit(failures);
        }
        ::close(addr_pipe[1]);
        ::close(stop_pipe[0]);
        const std::string where = read_line(addr_pipe[0]);
        CHECK(!where.empty(), "the child wrote its address");
        if (!where.empty() && hg_server) {
            talaria::Engine client{engine_url(info)};
            auto ep = client.lookup(where);
            auto mix = client.remote<uint64_t(uint32_t, uint64_t)>("mix").on(ep).timeout(10s);
            for (uint32_t i = 0; i < 20; ++i) {
                auto r = mix(i, 3).try_get();
                CHECK(r && *r == uint64_t(i) * 1000 + 3,
                      "a C++ call of an HG procedure in another process");
                if (!r) std::fprintf(stderr, "  %s\n", r.error().describe().c_str());
            }
        } else if (!where.empty()) {
            hg_class_t* cls = HG_Init(info.c_str(), HG_FALSE);
            CHECK(cls != nullptr, "HG_Init of the client");
            hg_context_t* ctx = cls ? HG_Context_create(cls) : nullptr;
            hg_id_t id =
                cls ? HG_Register_name(cls, "mix", hg_proc_pair_in_t, hg_proc_u64, nullptr) : 0;
            hg_addr_t addr = HG_ADDR_NULL;
            CHECK(ctx && HG_Addr_lookup2(cls, where.c_str(), &addr) == HG_SUCCESS,
                  "HG_Addr_lookup2 of the C++ server in another process");
            for (uint32_t i = 0; addr != HG_ADDR_NULL && i < 20; ++i) {
                Waiter w = call(ctx, addr, id, pair_in_t{i, 9});
                CHECK(w.done && w.ret == HG_SUCCESS && w.out == uint64_t(i) * 1000 + 9,
                      "an HG call of a C++ procedure in another process");
            }
            if (addr != HG_ADDR_NULL) HG_Addr_free(cls, addr);
            if (ctx) CHECK(HG_Context_destroy(ctx) == HG_SUCCESS, "HG_Context_destroy");
            if (cls) CHECK(HG_Finalize(cls) == HG_SUCCESS, "HG_Finalize");
        }
        ::close(stop_pipe[1]);  // the child stops serving
        ::close(addr_pipe[0]);
        int status = 0;
        CHECK(::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              hg_server ? "the HG server child exited 0" : "the C++ server child exited 0");
    }
    return failures;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s INFO_STRING [two_processes]\n", argv[0]);
        return 2;
    }
    const std::string info = argv[1];
    using namespace std::chrono_literals;
    if (argc > 2 && std::string(argv[2]) == "two_processes") return two_processes(info);

    // 1. C++ caller, HG server: HG_Register_name("mix") is talaria's remote("mix").
    {
        hg_class_t* cls = HG_Init(info.c_str(), HG_TRUE);
        CHECK(cls != nullptr, "HG_Init of the server");
        if (!cls) return failures;
        hg_context_t* ctx = HG_Context_create(cls);
        CHECK(ctx != nullptr, "HG_Context_create");
        hg_id_t id = HG_Register_name(cls, "mix", hg_proc_pair_in_t, hg_proc_u64, on_mix);
        CHECK(id != 0, "HG_Register_name(\"mix\")");
        ProgressThread progress(ctx);
        {
            talaria::Engine client{engine_url(info)};
            auto ep = client.lookup(talaria_address(cls));
            auto mix = client.remote<uint64_t(uint32_t, uint64_t)>("mix").on(ep).timeout(10s);
            for (uint32_t i = 0; i < 20; ++i) {
                auto r = mix(i, 7).try_get();
                CHECK(r && *r == uint64_t(i) * 1000 + 7, "a C++ call of an HG procedure");
                if (!r) std::fprintf(stderr, "  %s\n", r.error().describe().c_str());
            }
            // No signature is checked at an HG procedure: its proc decodes the caller's bytes
            // (8 where it needs 12: HG_Get_input fails) and the callback drops the request.
            auto wrong = client.remote<uint64_t(uint64_t)>("mix").on(ep).timeout(2s);
            auto bad = wrong(5).try_get();
            CHECK(!bad && undecodable == 1,
                  "12 bytes expected, 8 sent: HG_Get_input fails and the call does not succeed");
            if (bad)
                std::fprintf(stderr, "  got %llu\n", (unsigned long long)*bad);
            else
                std::fprintf(stderr, "  (as expected: %s)\n", bad.error().describe().c_str());
        }
        CHECK(served == 20, "every C++ call reached the HG callback");
        progress.stop();
        CHECK(HG_Context_destroy(ctx) == HG_SUCCESS, "HG_Context_destroy");
        CHECK(HG_Finalize(cls) == HG_SUCCESS, "HG_Finalize");
    }

    // 2. HG caller, C++ server: talaria's define("mix") is HG_Register_name("mix").
    {
        talaria::Engine server{engine_url(info), talaria::listen};
        std::atomic<int> cxx_served{0};
        server.define("mix", [&](uint32_t a, uint64_t b) {
            ++cxx_served;
            return uint64_t(a) * 1000 + b + 1;
        });
        hg_class_t* cls = HG_Init(info.c_str(), HG_FALSE);
        CHECK(cls != nullptr, "HG_Init of the client");
        if (!cls) return failures;
        hg_context_t* ctx = HG_Context_create(cls);
        hg_id_t id = HG_Register_name(cls, "mix", hg_proc_pair_in_t, hg_proc_u64, nullptr);
        std::string where = server.self_address();
        if (info.starts_with("na+")) where = "na+" + where;
        hg_addr_t addr = HG_ADDR_NULL;
        CHECK(HG_Addr_lookup2(cls, where.c_str(), &addr) == HG_SUCCESS, "HG_Addr_lookup2");
        for (uint32_t i = 0; i < 20; ++i) {
            Waiter w = call(ctx, addr, id, {i, 9});
            CHECK(w.done && w.ret == HG_SUCCESS && w.out == uint64_t(i) * 1000 + 10,
                  "an HG call of a C++ procedure");
        }
        CHECK(cxx_served == 20, "every HG call reached the C++ handler");

        // 3. The same procedure of the client at an HG server that registered the name's
        // Mercury id by number (HG_Register), which only Mercury's id reaches: the forward
        // finds it with that id; then the C++ server again.
        hg_class_t* srv = HG_Init(info.c_str(), HG_TRUE);
        CHECK(srv != nullptr, "HG_Init of the second server");
        if (!srv) return failures;
        hg_context_t* sctx = HG_Context_create(srv);
        CHECK(HG_Register(srv, id, hg_proc_pair_in_t, hg_proc_u64, on_mix) == HG_SUCCESS,
              "HG_Register of the name's id by number");
        ProgressThread progress(sctx);
        std::string srv_where = talaria_address(srv);
        if (info.starts_with("na+")) srv_where = "na+" + srv_where;
        hg_addr_t srv_addr = HG_ADDR_NULL;
        CHECK(HG_Addr_lookup2(cls, srv_where.c_str(), &srv_addr) == HG_SUCCESS,
              "HG_Addr_lookup2 of the second server");
        served = 0;
        for (uint32_t i = 0; i < 3; ++i) {
            Waiter w = call(ctx, srv_addr, id, {i, 4});
            CHECK(w.done && w.ret == HG_SUCCESS && w.out == uint64_t(i) * 1000 + 4,
                  "a call by name of a procedure registered by its Mercury id");
        }
        CHECK(served == 3, "every call reached the second server's callback");
        Waiter w = call(ctx, addr, id, {2, 1});
        CHECK(w.done && w.ret == HG_SUCCESS && w.out == 2002,
              "the C++ procedure after the other server");
        // An id nobody serves still fails with HG_NOENTRY (after both ids were tried).
        hg_id_t none =
            HG_Register_name(cls, "nobody.serves.this", hg_proc_pair_in_t, hg_proc_u64, nullptr);
        w = call(ctx, addr, none, {1, 1});
        CHECK(w.done && w.ret == HG_NOENTRY, "a procedure nobody serves: HG_NOENTRY");
        progress.stop();
        HG_Addr_free(cls, srv_addr);
        HG_Addr_free(cls, addr);
        CHECK(HG_Context_destroy(sctx) == HG_SUCCESS, "HG_Context_destroy of the second server");
        CHECK(HG_Finalize(srv) == HG_SUCCESS, "HG_Finalize of the second server");
        CHECK(HG_Context_destroy(ctx) == HG_SUCCESS, "HG_Context_destroy of the client");
        CHECK(HG_Finalize(cls) == HG_SUCCESS, "HG_Finalize of the client");
    }
    // 4. The talaria::Engine under an HG class, beside a thread in HG_Progress/HG_Trigger.
    {
        talaria::Engine other{engine_url(info), talaria::listen};
        other.define("mix", [](uint32_t a, uint64_t b) { return uint64_t(a) * 1000 + b; });
        std::vector<std::byte> file(1 << 20);
        for (std::size_t i = 0; i < file.size(); ++i)
            file[i] = std::byte(i * 7);
        talaria::Bulk exposed = other.expose({file.data(), file.size()}, talaria::read_only);
        other.define("file", [&] { return exposed; });  // the handle, as its peers decode it

        hg_class_t* cls = HG_Init(info.c_str(), HG_TRUE);
        CHECK(cls != nullptr, "HG_Init of the class whose engine is used");
        if (!cls) return failures;
        hg_context_t* ctx = HG_Context_create(cls);
        talaria::Engine* e = talaria::mercury::engine(cls);
        CHECK(e != nullptr && talaria::mercury::engine(nullptr) == nullptr,
              "talaria::mercury::engine of a class, and of none");
        std::atomic<int> twice_ran{0};
        std::atomic<bool> in_progress_thread{true};
        std::thread::id progress_id;
        e->define("twice", [&](uint64_t x) {
            ++twice_ran;
            if (std::this_thread::get_id() != progress_id) in_progress_thread = false;
            return 2 * x;
        });
        ProgressThread progress(ctx);
        progress_id = progress.id();
        {
            talaria::Engine client{engine_url(info)};
            auto twice = client.remote<uint64_t(uint64_t)>("twice")
                             .on(client.lookup(e->self_address()))
                             .timeout(10s);
            for (uint64_t i = 0; i < 20; ++i) {
                auto r = twice(i).try_get();
                CHECK(r && *r == 2 * i, "a call of what the class's engine defined");
            }
        }
        CHECK(twice_ran == 20 && in_progress_thread,
              "the class engine's handler ran 20 times, in the HG_Trigger thread");
        // The class's own calls, waited for in get() on this thread while the other thread
        // progresses the context (tsan checks the two drive it one at a time).
        auto ep = e->lookup(other.self_address());
        auto mix = e->remote<uint64_t(uint32_t, uint64_t)>("mix").on(ep).timeout(10s);
        for (uint32_t i = 0; i < 50; ++i) {
            auto r = mix(i, 3).try_get();
            CHECK(r && *r == uint64_t(i) * 1000 + 3, "a call from the class's engine in get()");
            if (!r) std::fprintf(stderr, "  %s\n", r.error().describe().c_str());
        }
        std::vector<std::byte> got(file.size());
        talaria::Bulk local = e->expose({got.data(), got.size()}, talaria::write_only);
        auto remote = e->remote<talaria::Bulk()>("file").on(ep).timeout(10s)().try_get();
        CHECK(remote.has_value(), "the remote handle, by a call of the class's engine");
        if (!remote) return failures;
        auto pulled = e->pull(*remote, 0, local, 0, got.size(), ep).try_get();
        CHECK(pulled && got == file, "a 1 MiB pull by the class's engine");
        if (!pulled) std::fprintf(stderr, "  %s\n", pulled.error().describe().c_str());
        local = {};
        *remote = {};
        progress.stop();
        ep = {};
        mix = {};
        CHECK(HG_Context_destroy(ctx) == HG_SUCCESS, "HG_Context_destroy (engine used)");
        CHECK(HG_Finalize(cls) == HG_SUCCESS, "HG_Finalize (engine used)");

        // Over an NA class with one context, all the HG class's: no transfer context.
        na_init_info ni{};
        ni.max_contexts = 1;
        na_class_t* na = NA_Initialize_opt(info.c_str(), false, &ni);
        CHECK(na != nullptr, "NA_Initialize");
        if (!na) return failures;
        hg_init_info hi{};  // HG_INIT_INFO_INITIALIZER is C (a compound literal)
        hi.na_class = na;
        hg_class_t* over = HG_Init_opt2(nullptr, HG_FALSE, HG_VERSION(2, 4), &hi);
        CHECK(over != nullptr, "HG_Init_opt2 over an NA class");
        if (!over) return failures;
        talaria::Engine* oe = talaria::mercury::engine(over);
        {
            std::vector<std::byte> buf(64);
            talaria::Bulk lb = oe->expose({buf.data(), buf.size()}, talaria::write_only);
            auto oep = oe->lookup(other.self_address());
            auto h = oe->remote<talaria::Bulk()>("file").on(oep).timeout(10s)().try_get();
            CHECK(h.has_value(), "the remote handle, by the engine over an NA class");
            if (!h) return failures;
            auto r = oe->pull(*h, 0, lb, 0, buf.size(), oep).try_get();
            CHECK(!r && r.error().code() == talaria::Errc::not_supported,
                  "a pull where the NA class has no context to spare: not_supported");
            if (!r) std::fprintf(stderr, "  (as expected: %s)\n", r.error().describe().c_str());
            auto c = oe->remote<uint64_t(uint32_t, uint64_t)>("mix").on(oep).timeout(10s)(4, 4);
            auto cr = c.try_get();
            CHECK(cr && *cr == 4004, "a call from the engine over an NA class, in get()");
        }
        CHECK(HG_Finalize(over) == HG_SUCCESS, "HG_Finalize over the NA class");
        CHECK(NA_Finalize(na) == NA_SUCCESS, "NA_Finalize after it");
    }
    if (failures) std::fprintf(stderr, "%d checks failed\n", failures);
    return failures;
}
