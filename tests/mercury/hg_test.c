/* Mercury's HG C API on Talaria, from C11, over the transport named by argv[1] (a Mercury info
 * string). A server and a client class in this process, one thread driving both: a call with
 * its input and output encoded by procs, a Margo-style 64-bit id given back exactly by
 * HG_Get_info, a response sent after the handler returned from input read then (kept until
 * HG_Free_input), 200 kB each way (past the eager size), a one-way call, an id the server does
 * not serve (HG_NOENTRY in the callback), an id not registered here (HG_NOENTRY from
 * HG_Create), a busy handle, bulk (a handle of three segments, one zero-size and one the
 * library allocates, pulled by the server's handler, then pushed into, and a zero-size
 * transfer), a bulk call from the client to itself (HG_Addr_self), and the teardown rules.
 * Callbacks and handlers must run in HG_Trigger only. Each check says what failed; the status is
 * the count. */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "mercury.h"
#include "mercury_bulk.h"
#include "mercury_proc.h"
#include "mercury_proc_bulk.h"
#include "mercury_proc_string.h"
#include "na.h"

typedef struct {
    hg_uint32_t a;
    hg_const_string_t s;
} sum_in_t;
typedef struct {
    hg_uint32_t sum;
    hg_string_t s;
} sum_out_t;

static hg_return_t hg_proc_sum_in_t(hg_proc_t proc, void* data) {
    sum_in_t* in = (sum_in_t*)data;
    hg_return_t ret = hg_proc_hg_uint32_t(proc, &in->a);
    return ret != HG_SUCCESS ? ret : hg_proc_hg_const_string_t(proc, &in->s);
}
static hg_return_t hg_proc_sum_out_t(hg_proc_t proc, void* data) {
    sum_out_t* out = (sum_out_t*)data;
    hg_return_t ret = hg_proc_hg_uint32_t(proc, &out->sum);
    return ret != HG_SUCCESS ? ret : hg_proc_hg_string_t(proc, &out->s);
}

static int in_trigger = 0, outside = 0;
static int responds = 0, responded = 0; /* HG_Respond with on_responded; its callbacks run */
static hg_id_t margo_id;                /* (djb2("sum") << 32) | 3 */
static hg_handle_t deferred = NULL;     /* a request answered after its handler returned */
static sum_in_t deferred_in;
static int handled = 0, one_way_seen = 0;

static int handles_made = 0, freed_data = 0;
static hg_return_t on_handle_created(hg_handle_t h, void* arg) {
    CHECK(h != HG_HANDLE_NULL && arg == (void*)&handles_made, "the create callback's arguments");
    ++handles_made;
    return HG_SUCCESS;
}
static void free_data(void* p) {
    freed_data += *(int*)p;
}

static hg_return_t sum_rpc(hg_handle_t h) {
    outside += !in_trigger;
    void* ibuf = NULL;
    hg_size_t isize = 0;
    CHECK(HG_Get_input_buf(h, &ibuf, &isize) == HG_SUCCESS && ibuf &&
              isize == HG_Get_input_payload_size(h) && isize >= 4,
          "HG_Get_input_buf: the encoded input");
    CHECK(HG_Ref_get(h) == 1, "a handler's handle starts at one reference");
    const struct hg_info* info = HG_Get_info(h);
    CHECK(info && info->id == margo_id, "HG_Get_info gives back the 64-bit id");
    CHECK(info && info->addr != HG_ADDR_NULL, "and the caller's address");
    CHECK(HG_Get_input(h, &deferred_in) == HG_SUCCESS, "the input decodes");
    deferred = h; /* answered later, from the main loop */
    ++handled;
    return HG_SUCCESS;
}

static hg_return_t note_rpc(hg_handle_t h) {
    outside += !in_trigger;
    sum_in_t in;
    CHECK(HG_Get_input(h, &in) == HG_SUCCESS && in.a == 42, "the one-way input");
    HG_Free_input(h, &in);
    ++one_way_seen;
    HG_Destroy(h);
    return HG_SUCCESS;
}

static hg_return_t on_responded(const struct hg_cb_info* info) {
    outside += !in_trigger;
    ++responded;
    CHECK(info->type == HG_CB_RESPOND && info->ret == HG_SUCCESS, "the response was sent");
    CHECK(HG_Get_output_payload_size(info->info.respond.handle) >= 4,
          "the target's output payload is what it encoded");
    return HG_SUCCESS;
}

struct call {
    int no_output; /* the caller reads the output itself */
    int done;
    hg_return_t ret;
    sum_out_t out;
    int got_output;
};

static hg_return_t on_forwarded(const struct hg_cb_info* info) {
    outside += !in_trigger;
    struct call* c = (struct call*)info->arg;
    c->ret = info->ret;
    if (info->ret == HG_SUCCESS && c->got_output == 0 && !c->no_output) {
        hg_handle_t h = info->info.forward.handle;
        if (HG_Get_output(h, &c->out) == HG_SUCCESS) c->got_output = 1;
    }
    c->done = 1;
    return HG_SUCCESS;
}

/* --- bulk: the client exposes its buffer in the input; the handler pulls it, pushes 10 'z'
 * bytes back at offset 0, and answers with the sum of what it pulled. */
typedef struct {
    hg_bulk_t data;
    hg_uint32_t n;
} write_in_t;
static hg_return_t hg_proc_write_in_t(hg_proc_t proc, void* data) {
    write_in_t* in = (write_in_t*)data;
    hg_return_t ret = hg_proc_hg_bulk_t(proc, &in->data);
    return ret != HG_SUCCESS ? ret : hg_proc_hg_uint32_t(proc, &in->n);
}
static hg_return_t hg_proc_write_out_t(hg_proc_t proc, void* data) {
    return hg_proc_hg_uint32_t(proc, data);
}

struct write_state {
    hg_handle_t h;
    write_in_t in;
    hg_bulk_t local;
    hg_bulk_t zs;
    int stage;
    hg_uint32_t sum;
};
static struct write_state ws;
static int pull_bound = 0; /* the handler pulls with HG_Bulk_bind_transfer */
static int zero_done = 0;

static hg_return_t on_zero(const struct hg_cb_info* info) {
    outside += !in_trigger;
    CHECK(info->ret == HG_SUCCESS && info->info.bulk.size == 0, "a zero-size transfer completes");
    zero_done = 1;
    return HG_SUCCESS;
}

static hg_return_t on_bulk(const struct hg_cb_info* info) {
    outside += !in_trigger;
    CHECK(info->type == HG_CB_BULK && info->ret == HG_SUCCESS, "a bulk transfer completed");
    hg_class_t* cls = HG_Get_info(ws.h)->hg_class;
    if (ws.stage == 0) { /* pulled: sum it, then push 'z' bytes */
        CHECK(info->info.bulk.op == HG_BULK_PULL && info->info.bulk.size == ws.in.n,
              "the pull moved every byte");
        void* ptrs[4];
        hg_size_t sizes[4];
        uint32_t n = 0;
        CHECK(HG_Bulk_access(ws.local, 0, ws.in.n, HG_BULK_READWRITE, 4, ptrs, sizes, &n) ==
                      HG_SUCCESS &&
                  n == 1 && sizes[0] == ws.in.n,
              "HG_Bulk_access of the library's memory");
        ws.sum = 0;
        for (hg_uint32_t i = 0; i < ws.in.n; ++i)
            ws.sum += ((unsigned char*)ptrs[0])[i];
        memset(ptrs[0], 'z', 10);
        ws.stage = 1;
        CHECK(HG_Bulk_transfer(HG_Get_info(ws.h)->context, on_bulk, NULL, HG_BULK_PUSH,
                               HG_Get_info(ws.h)->addr, ws.in.data, 0, ws.local, 0, 10,
                               HG_OP_ID_IGNORE) == HG_SUCCESS,
              "a push back to the origin");
    } else { /* pushed: answer */
        CHECK(info->info.bulk.op == HG_BULK_PUSH && info->info.bulk.size == 10, "the push");
        CHECK(HG_Respond(ws.h, NULL, NULL, &ws.sum) == HG_SUCCESS, "the bulk RPC's answer");
        HG_Bulk_free(ws.local);
        HG_Free_input(ws.h, &ws.in);
        HG_Destroy(ws.h);
        (void)cls;
    }
    return HG_SUCCESS;
}

static hg_return_t write_rpc(hg_handle_t h) {
    outside += !in_trigger;
    memset(&ws, 0, sizeof ws);
    ws.h = h;
    CHECK(HG_Get_input(h, &ws.in) == HG_SUCCESS && ws.in.data != HG_BULK_NULL,
          "the input carries a bulk handle");
    CHECK(HG_Bulk_get_size(ws.in.data) == ws.in.n, "of the size the client exposed");
    hg_size_t n = ws.in.n;
    CHECK(HG_Bulk_create(HG_Get_info(h)->hg_class, 1, NULL, &n, HG_BULK_READWRITE, &ws.local) ==
              HG_SUCCESS,
          "a local handle the library allocates");
    /* A zero-size transfer still completes through trigger. */
    CHECK(
        HG_Bulk_transfer(HG_Get_info(h)->context, on_zero, NULL, HG_BULK_PULL, HG_Get_info(h)->addr,
                         ws.in.data, 0, ws.local, 0, 0, HG_OP_ID_IGNORE) == HG_SUCCESS,
        "a zero-size transfer");
    if (pull_bound) /* the handle's owner: the client that sent it, though it does not listen */
        CHECK(HG_Bulk_get_addr(ws.in.data) != HG_ADDR_NULL &&
                  HG_Bulk_bind_transfer(HG_Get_info(h)->context, on_bulk, NULL, HG_BULK_PULL,
                                        ws.in.data, 0, ws.local, 0, ws.in.n,
                                        HG_OP_ID_IGNORE) == HG_SUCCESS,
              "the pull from the bound handle's owner");
    else
        CHECK(HG_Bulk_transfer(HG_Get_info(h)->context, on_bulk, NULL, HG_BULK_PULL,
                               HG_Get_info(h)->addr, ws.in.data, 0, ws.local, 0, ws.in.n,
                               HG_OP_ID_IGNORE) == HG_SUCCESS,
              "the pull");
    return HG_SUCCESS;
}

static hg_handle_t held = NULL; /* a request never answered (the caller cancels) */
static int hang_seen = 0;
static hg_return_t hang_rpc(hg_handle_t h) {
    held = h;
    hang_seen = 1;
    return HG_SUCCESS;
}

static int looked_up = 0;
static hg_addr_t lookup_result = HG_ADDR_NULL;
static hg_return_t on_lookup(const struct hg_cb_info* info) {
    outside += !in_trigger;
    CHECK(info->type == HG_CB_LOOKUP && info->ret == HG_SUCCESS, "HG_Addr_lookup1's callback");
    lookup_result = info->info.lookup.addr;
    looked_up = 1;
    return HG_SUCCESS;
}

static void drive(hg_context_t* a, hg_context_t* b, int* flag) {
    const time_t until = time(NULL) + 15;
    while (!*flag && time(NULL) < until) {
        hg_context_t* cs[2] = {a, b};
        for (int i = 0; i < 2; ++i) {
            unsigned n = 0;
            (void)HG_Progress(cs[i], 1);
            in_trigger = 1;
            (void)HG_Trigger(cs[i], 0, 16, &n);
            in_trigger = 0;
        }
        if (deferred) { /* answer the request whose handler returned */
            sum_out_t out;
            char echo[64];
            snprintf(echo, sizeof echo, "%.60s", deferred_in.s);
            out.sum = deferred_in.a + 1;
            out.s = strlen(deferred_in.s) > 1000 ? (char*)deferred_in.s : echo;
            CHECK(HG_Respond(deferred, on_responded, NULL, &out) == HG_SUCCESS, "HG_Respond");
            ++responds;
            HG_Free_input(deferred, &deferred_in);
            HG_Destroy(deferred);
            deferred = NULL;
        }
    }
}

/* Drive both contexts as a program with its own poll loop does (Mercury's perf tools):
   block on the two wait fds only when HG_Event_ready says neither has work, then progress and
   trigger each. A poll that times out while a call is in flight is a lost wake-up. */
static int lost_wakeups = 0;
static void event_drive(hg_context_t* a, hg_context_t* b, int* flag) {
    const time_t until = time(NULL) + 15;
    hg_context_t* cs[2] = {a, b};
    while (!*flag && time(NULL) < until) {
        if (deferred) {
            sum_out_t out = {deferred_in.a + 1, "polled"};
            CHECK(HG_Respond(deferred, on_responded, NULL, &out) == HG_SUCCESS, "HG_Respond");
            ++responds;
            HG_Free_input(deferred, &deferred_in);
            HG_Destroy(deferred);
            deferred = NULL;
        }
        struct pollfd p[2] = {{HG_Event_get_wait_fd(a), POLLIN, 0},
                              {HG_Event_get_wait_fd(b), POLLIN, 0}};
        if (p[0].fd >= 0 && p[1].fd >= 0 && !HG_Event_ready(a) && !HG_Event_ready(b) &&
            poll(p, 2, 2000) == 0)
            ++lost_wakeups;
        for (int i = 0; i < 2; ++i) {
            unsigned n = 0;
            (void)HG_Event_progress(cs[i], &n);
            in_trigger = 1;
            (void)HG_Event_trigger(cs[i], 16, &n);
            in_trigger = 0;
        }
    }
}

int main(int argc, char** argv) {
    const char* info = argc > 1 ? argv[1] : "na+sm";
    CHECK(strcmp(HG_Error_to_string(HG_NOENTRY), "HG_NOENTRY") == 0, "error names");
    unsigned maj = 0, min = 0, pat = 0;
    HG_Version_get(&maj, &min, &pat);
    CHECK(maj == 2 && min == 4 && pat == 1, "version 2.4.1");

    {
        /* HG_Init_opt reads the 2.2 layout (88 bytes) and nothing past it: a buffer of exactly
           that size, its padding dirty (AddressSanitizer catches a read past its end). */
        unsigned char* old = (unsigned char*)malloc(88);
        memset(old, 0xAB, 88);
        struct na_init_info_4_0 na0 = NA_INIT_INFO_INITIALIZER_4_0;
        memcpy(old, &na0, sizeof na0);
        void* null_class = NULL;
        memcpy(old + 48, &null_class, sizeof null_class); /* na_class */
        memset(old + 56, 0, 8);                           /* request_post_init, _incr */
        old[64] = 0;                                      /* auto_sm */
        memcpy(old + 72, &null_class, sizeof null_class); /* sm_info_string */
        memset(old + 80, 0, 4);                           /* checksum_level */
        old[84] = old[85] = old[86] = 0;                  /* no_bulk_eager, no_loopback, stats */
        hg_class_t* c22 = HG_Init_opt(info, 0, (const struct hg_init_info*)old);
        CHECK(c22 != NULL, "HG_Init_opt with a 2.2-layout hg_init_info");
        if (c22) CHECK(HG_Finalize(c22) == HG_SUCCESS, "and it closes");
        free(old);
    }
    /* With --na-class the server opens its NA class itself and gives it to HG_Init_opt2, as
       Mercury's test harness does; HG_Finalize leaves it to the program. */
    const int own_na = argc > 2 && strcmp(argv[2], "--na-class") == 0;
    na_class_t* na = NULL;
    hg_class_t* srv = NULL;
    if (own_na) {
        struct na_init_info na_info = NA_INIT_INFO_INITIALIZER;
        na = NA_Initialize_opt2(info, 1, NA_VERSION(4, 0), &na_info);
        CHECK(na != NULL, "NA_Initialize_opt2");
        if (!na) return 1;
        struct hg_init_info hi = HG_INIT_INFO_INITIALIZER;
        hi.na_class = na;
        CHECK(HG_Init_opt2(NULL, 1, HG_VERSION(2, 4), NULL) == NULL,
              "no info string and no NA class: no class");
        /* The info string is not used over an NA class: Mercury's harness passes NULL. */
        srv = HG_Init_opt2(NULL, 1, HG_VERSION(2, 4), &hi);
        CHECK(srv && strcmp(HG_Class_get_name(srv), NA_Get_class_name(na)) == 0 &&
                  strcmp(HG_Class_get_protocol(srv), NA_Get_class_protocol(na)) == 0,
              "a class over the program's NA class names its class and protocol");
        CHECK(NA_Finalize(na) == NA_BUSY, "NA_Finalize while an HG class uses it is NA_BUSY");
    } else {
        srv = HG_Init(info, 1);
    }
    if (!srv) {
        fprintf(stderr, "cannot open %s\n", info);
        return 1;
    }
    char client_info[64];
    snprintf(client_info, sizeof client_info, "%s", info);
    char* sep = strstr(client_info, "://");
    if (sep && strncmp(client_info, "inproc", 6) != 0) {
        char* port = strrchr(sep + 3, ':');
        if (port) strcpy(port, ":0");
    }
    hg_class_t* cli = HG_Init(client_info, 0);
    CHECK(cli != NULL, "the client opens");
    if (!cli) return 1;
    CHECK(HG_Class_is_listening(srv) && !HG_Class_is_listening(cli), "who listens");
    CHECK(HG_Class_get_name(srv) && HG_Class_get_protocol(srv) &&
              HG_Class_get_input_eager_size(srv) > 0 && HG_Class_get_output_eager_size(srv) > 0,
          "the class's name, protocol and eager sizes");
    CHECK(HG_Class_set_input_offset(srv, 0) == HG_SUCCESS &&
              HG_Class_set_input_offset(srv, 16) == HG_OPNOTSUPPORTED,
          "an input offset other than 0 is not supported yet");
    static int one = 1, ten = 10;
    CHECK(HG_Class_set_data(cli, &one, free_data) == HG_SUCCESS && HG_Class_get_data(cli) == &one,
          "class data");
    CHECK(HG_Class_set_handle_create_callback(srv, on_handle_created, &handles_made) == HG_SUCCESS,
          "the handle create callback");
    hg_context_t *sctx = HG_Context_create(srv), *cctx = HG_Context_create(cli);
    CHECK(sctx && cctx && HG_Context_get_class(sctx) == srv && HG_Context_get_id(cctx) == 0,
          "contexts");
    CHECK(HG_Context_set_data(cctx, &ten, free_data) == HG_SUCCESS &&
              HG_Context_get_data(cctx) == &ten && HG_Context_unpost(cctx) == HG_SUCCESS,
          "context data");

    /* Margo's ids: hash << 32 | provider. */
    hg_id_t plain = HG_Register_name(cli, "sum", hg_proc_sum_in_t, hg_proc_sum_out_t, NULL);
    CHECK(plain != 0, "HG_Register_name");
    margo_id = (plain << 32) | 3;
    CHECK(HG_Register(srv, margo_id, hg_proc_sum_in_t, hg_proc_sum_out_t, sum_rpc) == HG_SUCCESS &&
              HG_Register(cli, margo_id, hg_proc_sum_in_t, hg_proc_sum_out_t, NULL) == HG_SUCCESS,
          "a 64-bit id registered on both");
    hg_id_t note = HG_Register_name(srv, "note", hg_proc_sum_in_t, NULL, note_rpc);
    CHECK(note != 0 && HG_Register_name(cli, "note", hg_proc_sum_in_t, NULL, NULL) == note,
          "the same name, the same id");
    HG_Registered_disable_response(srv, note, 1);
    HG_Registered_disable_response(cli, note, 1);
    hg_id_t missing = HG_Register_name(cli, "not.at.the.server", NULL, NULL, NULL);
    uint8_t flag = 0;
    CHECK(HG_Registered(cli, missing, &flag) == HG_SUCCESS && flag, "HG_Registered");
    CHECK(HG_Registered(srv, missing, &flag) == HG_SUCCESS && !flag, "not on the server");

    /* The server's address as a string. */
    hg_addr_t self = HG_ADDR_NULL, server = HG_ADDR_NULL;
    CHECK(HG_Addr_self(srv, &self) == HG_SUCCESS, "self");
    hg_size_t len = 0;
    CHECK(HG_Addr_to_string(srv, NULL, &len, self) == HG_SUCCESS && len > 1, "size query");
    char* name = (char*)malloc(len);
    CHECK(HG_Addr_to_string(srv, name, &len, self) == HG_SUCCESS, "the string");
    CHECK(HG_Addr_lookup2(cli, name, &server) == HG_SUCCESS, "the client looks it up");

    /* A call answered after its handler returned. */
    hg_handle_t h = HG_HANDLE_NULL;
    CHECK(HG_Create(cctx, server, margo_id, &h) == HG_SUCCESS, "HG_Create");
    hg_handle_t nope = HG_HANDLE_NULL;
    CHECK(HG_Create(cctx, server, 0x1234, &nope) == HG_NOENTRY, "an unregistered id");
    struct call c1 = {0};
    sum_in_t in = {41, "hello"};
    CHECK(HG_Forward(h, on_forwarded, &c1, &in) == HG_SUCCESS, "HG_Forward");
    CHECK(HG_Forward(h, on_forwarded, &c1, &in) == HG_BUSY, "a handle forwarding is busy");
    in.a = 0; /* encoded already: the caller may change it */
    drive(sctx, cctx, &c1.done);
    CHECK(c1.done && c1.ret == HG_SUCCESS && c1.got_output, "the call completed");
    CHECK(c1.out.sum == 42 && c1.out.s && strcmp(c1.out.s, "hello") == 0, "its output");
    CHECK(HG_Get_input_payload_size(h) >= 4 + 5 &&
              HG_Get_output_payload_size(h) >= HG_Get_input_payload_size(h),
          "the origin's payload sizes: what it encoded, what it received");
    if (c1.got_output) HG_Free_output(h, &c1.out);

    /* 200 kB each way, on the same handle. */
    char* big = (char*)malloc(200001);
    for (int i = 0; i < 200000; ++i)
        big[i] = (char)('a' + i % 26);
    big[200000] = 0;
    struct call c2 = {0};
    sum_in_t in2 = {1, big};
    CHECK(HG_Forward(h, on_forwarded, &c2, &in2) == HG_SUCCESS, "a 200 kB forward");
    drive(sctx, cctx, &c2.done);
    CHECK(
        c2.done && c2.ret == HG_SUCCESS && c2.got_output && c2.out.s && strcmp(c2.out.s, big) == 0,
        "200 kB went and came back");
    if (c2.got_output) HG_Free_output(h, &c2.out);
    HG_Destroy(h);

    /* One-way. */
    hg_handle_t hn = HG_HANDLE_NULL;
    struct call c3 = {0};
    sum_in_t in3 = {42, "note"};
    CHECK(HG_Create(cctx, server, note, &hn) == HG_SUCCESS &&
              HG_Forward(hn, on_forwarded, &c3, &in3) == HG_SUCCESS,
          "a one-way forward");
    drive(sctx, cctx, &one_way_seen);
    drive(sctx, cctx, &c3.done);
    CHECK(one_way_seen == 1 && c3.done && c3.ret == HG_SUCCESS, "the one-way call arrived");
    HG_Destroy(hn);

    /* An id the server does not serve. */
    hg_handle_t hm = HG_HANDLE_NULL;
    struct call c4 = {0};
    CHECK(HG_Create(cctx, server, missing, &hm) == HG_SUCCESS &&
              HG_Forward(hm, on_forwarded, &c4, NULL) == HG_SUCCESS,
          "a call the server does not serve");
    drive(sctx, cctx, &c4.done);
    CHECK(c4.done && c4.ret == HG_NOENTRY, "HG_NOENTRY in the callback");
    HG_Destroy(hm);
    /* Bulk. */
    hg_id_t wid =
        HG_Register_name(srv, "write", hg_proc_write_in_t, hg_proc_write_out_t, write_rpc);
    CHECK(HG_Register_name(cli, "write", hg_proc_write_in_t, hg_proc_write_out_t, NULL) == wid,
          "the bulk RPC registered");
    unsigned char part1[1000], part3[24];
    for (int i = 0; i < 1000; ++i)
        part1[i] = (unsigned char)i;
    void* ptrs[3] = {part1, NULL, part3};
    hg_size_t sizes[3] = {1000, 0, 24};
    for (int i = 0; i < 24; ++i)
        part3[i] = 7;
    hg_bulk_t mine = HG_BULK_NULL;
    CHECK(HG_Bulk_create(cli, 3, ptrs, sizes, HG_BULK_READWRITE, &mine) == HG_SUCCESS &&
              HG_Bulk_get_size(mine) == 1024 && HG_Bulk_get_segment_count(mine) == 3,
          "a handle of three segments, one of zero size");
    hg_uint32_t want = 0;
    for (int i = 0; i < 1000; ++i)
        want += part1[i];
    want += 24 * 7;
    hg_handle_t hw = HG_HANDLE_NULL;
    struct call c5 = {1, 0, HG_SUCCESS, {0, NULL}, 0};
    hg_uint32_t sum = 0;
    write_in_t win = {mine, 1024};
    CHECK(HG_Create(cctx, server, wid, &hw) == HG_SUCCESS &&
              HG_Forward(hw, on_forwarded, &c5, &win) == HG_SUCCESS,
          "the bulk RPC forwarded");
    drive(sctx, cctx, &c5.done);
    CHECK(c5.done && c5.ret == HG_SUCCESS, "the bulk RPC completed");
    if (c5.done && c5.ret == HG_SUCCESS) {
        CHECK(HG_Get_output(hw, &sum) == HG_SUCCESS && sum == want, "the server summed our bytes");
        HG_Free_output(hw, &sum);
    }
    CHECK(zero_done, "the zero-size transfer's callback ran");
    CHECK(memcmp(part1, "zzzzzzzzzz", 10) == 0 && part1[10] == 10, "the server pushed 10 bytes");
    /* Bound by a client that does not listen: the server pulls from the handle's owner, the
       client that sent it (HG_Bulk_bind_transfer), as Mercury's clients bind theirs. */
    CHECK(HG_Bulk_bind(mine, cctx) == HG_SUCCESS && HG_Bulk_get_addr(mine) != HG_ADDR_NULL,
          "HG_Bulk_bind on a class that does not listen");
    hg_uint32_t want2 = want;
    for (int i = 0; i < 10; ++i)
        want2 = want2 - (hg_uint32_t)i + (hg_uint32_t)'z';
    struct call c5b = {1, 0, HG_SUCCESS, {0, NULL}, 0};
    pull_bound = 1;
    zero_done = 0;
    CHECK(HG_Reset(hw, server, wid) == HG_SUCCESS &&
              HG_Forward(hw, on_forwarded, &c5b, &win) == HG_SUCCESS,
          "the bound handle forwarded");
    drive(sctx, cctx, &c5b.done);
    pull_bound = 0;
    CHECK(c5b.done && c5b.ret == HG_SUCCESS, "the bulk RPC over a bound handle completed");
    if (c5b.done && c5b.ret == HG_SUCCESS) {
        CHECK(HG_Get_output(hw, &sum) == HG_SUCCESS && sum == want2,
              "the server pulled from the bound handle's owner");
        HG_Free_output(hw, &sum);
    }
    HG_Destroy(hw);
    HG_Bulk_free(mine);
    CHECK(handled == 2, "both sum calls were handled");

    /* Forward to self from the class that does not listen (Mercury's --self_send tests): the
       client serves "write" itself, and its handler pulls and pushes the client's own memory. */
    CHECK(HG_Register(cli, wid, hg_proc_write_in_t, hg_proc_write_out_t, write_rpc) == HG_SUCCESS,
          "the client serves the bulk RPC too");
    hg_addr_t me = HG_ADDR_NULL;
    CHECK(HG_Addr_self(cli, &me) == HG_SUCCESS, "HG_Addr_self");
    for (int i = 0; i < 10; ++i)
        part1[i] = (unsigned char)i;
    hg_bulk_t own = HG_BULK_NULL;
    CHECK(HG_Bulk_create(cli, 3, ptrs, sizes, HG_BULK_READWRITE, &own) == HG_SUCCESS,
          "a handle of the client's own memory");
    write_in_t win_self = {own, 1024};
    struct call c_self = {1, 0, HG_SUCCESS, {0, NULL}, 0};
    hg_handle_t hs = HG_HANDLE_NULL;
    zero_done = 0;
    CHECK(HG_Create(cctx, me, wid, &hs) == HG_SUCCESS &&
              HG_Forward(hs, on_forwarded, &c_self, &win_self) == HG_SUCCESS,
          "the bulk RPC forwarded to self");
    drive(cctx, cctx, &c_self.done);
    CHECK(c_self.done && c_self.ret == HG_SUCCESS, "the bulk RPC to self completed");
    if (c_self.done && c_self.ret == HG_SUCCESS) {
        CHECK(HG_Get_output(hs, &sum) == HG_SUCCESS && sum == want, "it summed our own bytes");
        HG_Free_output(hs, &sum);
    }
    CHECK(zero_done, "the zero-size transfer to self completed");
    CHECK(memcmp(part1, "zzzzzzzzzz", 10) == 0 && part1[10] == 10, "and pushed into them");
    HG_Destroy(hs);
    HG_Bulk_free(own);
    HG_Addr_free(cli, me);

    /* HG_Addr_lookup (lookup1): its callback in trigger. */
    CHECK(HG_Addr_lookup(cctx, on_lookup, NULL, name, HG_OP_ID_IGNORE) == HG_SUCCESS,
          "HG_Addr_lookup1");
    drive(sctx, cctx, &looked_up);
    CHECK(looked_up && HG_Addr_cmp(cli, lookup_result, server), "the same address");
    HG_Addr_free(cli, lookup_result);

    /* HG_Cancel of a call the server never answers; HG_Reset of an idle handle. */
    hg_id_t hang = HG_Register_name(srv, "hang", NULL, NULL, hang_rpc);
    CHECK(HG_Register_name(cli, "hang", NULL, NULL, NULL) == hang, "hang registered");
    hg_handle_t hh = HG_HANDLE_NULL;
    struct call c6 = {1, 0, HG_SUCCESS, {0, NULL}, 0};
    CHECK(HG_Create(cctx, server, hang, &hh) == HG_SUCCESS &&
              HG_Forward(hh, on_forwarded, &c6, NULL) == HG_SUCCESS,
          "a call nobody answers");
    drive(sctx, cctx, &hang_seen);
    CHECK(held != NULL, "the server holds it");
    CHECK(HG_Cancel(hh) == HG_SUCCESS, "HG_Cancel");
    drive(sctx, cctx, &c6.done);
    CHECK(c6.done && c6.ret == HG_CANCELED, "the forward callback says HG_CANCELED");
    CHECK(HG_Reset(hh, server, margo_id) == HG_SUCCESS && HG_Get_info(hh)->id == margo_id,
          "HG_Reset to another id");
    CHECK(HG_Reset(hh, server, 0x777) == HG_NOENTRY, "HG_Reset to an unknown id");
    /* The reset handle calls sum, driven through the event API (nothing blocks). */
    struct call c7 = {0};
    sum_in_t in7 = {1, "event"};
    CHECK(HG_Forward(hh, on_forwarded, &c7, &in7) == HG_SUCCESS, "forward after reset");
    CHECK(HG_Event_get_wait_fd(cctx) >= -1, "a wait fd (or none)");
    {
        const time_t until = time(NULL) + 10;
        while (!c7.done && time(NULL) < until) {
            unsigned n = 0;
            (void)HG_Event_progress(sctx, &n);
            in_trigger = 1;
            (void)HG_Event_trigger(sctx, 16, &n);
            in_trigger = 0;
            if (deferred) drive(sctx, cctx, &c7.done);
            (void)HG_Event_progress(cctx, &n);
            if (HG_Event_ready(cctx) || n) {
                in_trigger = 1;
                (void)HG_Event_trigger(cctx, 16, &n);
                in_trigger = 0;
            }
        }
    }
    CHECK(c7.done && c7.ret == HG_SUCCESS && c7.got_output && c7.out.sum == 2,
          "a call driven by the event API");
    if (c7.got_output) HG_Free_output(hh, &c7.out);
    /* The same, blocking on the wait fds between events. */
    struct call c8 = {0};
    sum_in_t in8 = {7, "poll"};
    CHECK(HG_Forward(hh, on_forwarded, &c8, &in8) == HG_SUCCESS, "a forward driven by poll");
    event_drive(sctx, cctx, &c8.done);
    CHECK(c8.done && c8.ret == HG_SUCCESS && c8.got_output && c8.out.sum == 8 &&
              strcmp(c8.out.s, "polled") == 0,
          "a call driven by poll on the wait fds and HG_Event_ready");
    CHECK(lost_wakeups == 0, "no poll waited out its timeout with a call in flight");
    if (c8.got_output) HG_Free_output(hh, &c8.out);
    HG_Destroy(hh);
    if (held) {
        HG_Destroy(held); /* never answered: the core answers for it */
        held = NULL;
    }
    struct hg_diag_counters dc;
    CHECK(HG_Class_get_counters(cli, &dc) == HG_SUCCESS && dc.rpc_req_sent_count >= 5,
          "the client's counters");
    CHECK(HG_Class_get_counters(srv, &dc) == HG_SUCCESS && dc.rpc_req_recv_count >= 4,
          "the server's counters");

    CHECK(outside == 0, "handlers and callbacks ran in HG_Trigger only");
    CHECK(handles_made >= 4, "the create callback ran for the server's handles");
    CHECK(HG_Addr_set_remove(cli, server) == HG_SUCCESS, "HG_Addr_set_remove");
    {
        /* As Mercury's unit test does: the address looked up again after set_remove serves. */
        hg_addr_t again = HG_ADDR_NULL;
        hg_handle_t ha = HG_HANDLE_NULL;
        struct call c9 = {0};
        sum_in_t in9 = {2, "again"};
        CHECK(HG_Addr_lookup2(cli, name, &again) == HG_SUCCESS &&
                  HG_Create(cctx, again, margo_id, &ha) == HG_SUCCESS &&
                  HG_Forward(ha, on_forwarded, &c9, &in9) == HG_SUCCESS,
              "a call after HG_Addr_set_remove");
        drive(sctx, cctx, &c9.done);
        CHECK(c9.done && c9.ret == HG_SUCCESS && c9.got_output && c9.out.sum == 3,
              "the peer still answers after HG_Addr_set_remove");
        if (c9.got_output) HG_Free_output(ha, &c9.out);
        if (ha) HG_Destroy(ha);
        if (again) HG_Addr_free(cli, again);
    }

    /* Busy mode (NA_NO_BLOCK): no wait fd, and progress polls for its whole timeout. */
    {
        struct hg_init_info bi = HG_INIT_INFO_INITIALIZER;
        bi.na_init_info.progress_mode = NA_NO_BLOCK;
        hg_class_t* busy = HG_Init_opt2(client_info, 0, HG_VERSION(2, 4), &bi);
        CHECK(busy != NULL, "a class in busy mode");
        hg_context_t* bctx = busy ? HG_Context_create(busy) : NULL;
        if (bctx) {
            CHECK(HG_Event_get_wait_fd(bctx) == -1, "busy mode has no wait fd");
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            CHECK(HG_Progress(bctx, 20) == HG_TIMEOUT, "busy progress with nothing to do");
            clock_gettime(CLOCK_MONOTONIC, &t1);
            const double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
            CHECK(ms >= 19, "and it returns when its timeout is up");
            CHECK(HG_Context_destroy(bctx) == HG_SUCCESS, "busy context destroyed");
        }
        if (busy) CHECK(HG_Finalize(busy) == HG_SUCCESS, "busy class closed");
    }

    /* Teardown. */
    CHECK(HG_Finalize(cli) == HG_BUSY, "HG_Finalize with live objects is HG_BUSY");
    HG_Addr_free(cli, server);
    HG_Addr_free(srv, self);
    if (strcmp(info, "inproc://") == 0 && !own_na) {
        /* A handle the program still holds keeps its context busy, after Mercury's 5 s of
           progressing it (once, on inproc: it costs those 5 s). */
        hg_handle_t kept = NULL;
        CHECK(HG_Create(cctx, HG_ADDR_NULL, 0, &kept) == HG_SUCCESS || kept == NULL,
              "a handle to hold");
        if (kept) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            CHECK(HG_Context_destroy(cctx) == HG_BUSY, "a held handle keeps its context busy");
            clock_gettime(CLOCK_MONOTONIC, &t1);
            CHECK(t1.tv_sec - t0.tv_sec >= 4, "after progressing it for Mercury's 5 s");
            HG_Destroy(kept);
        }
    }
    /* The respond callbacks still queued run in HG_Context_destroy, as in Mercury's (which
       progresses and triggers a context until its handles are released). */
    CHECK(HG_Context_destroy(cctx) == HG_SUCCESS && HG_Context_destroy(sctx) == HG_SUCCESS,
          "contexts destroyed");
    CHECK(responded == responds, "every respond callback ran, the last ones in the destroy");
    CHECK(HG_Finalize(cli) == HG_SUCCESS && HG_Finalize(srv) == HG_SUCCESS, "classes closed");
    if (na) {
        /* The NA class outlives the HG class and still serves. */
        na_addr_t* na_self = NULL;
        CHECK(NA_Addr_self(na, &na_self) == NA_SUCCESS, "the NA class works after HG_Finalize");
        if (na_self) NA_Addr_free(na, na_self);
        CHECK(NA_Finalize(na) == NA_SUCCESS, "the program finalizes its NA class");
    }
    CHECK(freed_data == 11, "the class's and the context's data were freed");
    free(big);
    free(name);
    if (failures == 0)
        printf("HG over %s%s: every check passed\n", info,
               own_na ? " (NA class of the program)" : "");
    return failures;
}
