/* Mercury's HG C API on Talaria, from C11, over the transport named by argv[1] (a Mercury info
 * string). A server and a client class in this process, one thread driving both: a call with
 * its input and output encoded by procs, a Margo-style 64-bit id given back exactly by
 * HG_Get_info, a response sent after the handler returned from input read then (kept until
 * HG_Free_input), 200 kB each way (past the eager size), a one-way call, an id the server does
 * not serve (HG_NOENTRY in the callback), an id not registered here (HG_NOENTRY from
 * HG_Create), a busy handle, and the teardown rules. Callbacks and handlers must run in
 * HG_Trigger only. Each check says what failed; the status is the count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mercury.h"
#include "mercury_proc.h"
#include "mercury_proc_string.h"

static int failures = 0;
#define CHECK(cond, what)                                                                       \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what);                           \
            ++failures;                                                                         \
        }                                                                                       \
    } while (0)

typedef struct {
    hg_uint32_t a;
    hg_const_string_t s;
} sum_in_t;
typedef struct {
    hg_uint32_t sum;
    hg_string_t s;
} sum_out_t;

static hg_return_t hg_proc_sum_in_t(hg_proc_t proc, void *data) {
    sum_in_t *in = (sum_in_t *)data;
    hg_return_t ret = hg_proc_hg_uint32_t(proc, &in->a);
    return ret != HG_SUCCESS ? ret : hg_proc_hg_const_string_t(proc, &in->s);
}
static hg_return_t hg_proc_sum_out_t(hg_proc_t proc, void *data) {
    sum_out_t *out = (sum_out_t *)data;
    hg_return_t ret = hg_proc_hg_uint32_t(proc, &out->sum);
    return ret != HG_SUCCESS ? ret : hg_proc_hg_string_t(proc, &out->s);
}

static int in_trigger = 0, outside = 0;
static hg_id_t margo_id;            /* (djb2("sum") << 32) | 3 */
static hg_handle_t deferred = NULL; /* a request answered after its handler returned */
static sum_in_t deferred_in;
static int handled = 0, one_way_seen = 0;

static hg_return_t sum_rpc(hg_handle_t h) {
    outside += !in_trigger;
    const struct hg_info *info = HG_Get_info(h);
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

static hg_return_t on_responded(const struct hg_cb_info *info) {
    outside += !in_trigger;
    CHECK(info->type == HG_CB_RESPOND && info->ret == HG_SUCCESS, "the response was sent");
    return HG_SUCCESS;
}

struct call {
    int done;
    hg_return_t ret;
    sum_out_t out;
    int got_output;
};

static hg_return_t on_forwarded(const struct hg_cb_info *info) {
    outside += !in_trigger;
    struct call *c = (struct call *)info->arg;
    c->ret = info->ret;
    if (info->ret == HG_SUCCESS && c->got_output == 0) {
        hg_handle_t h = info->info.forward.handle;
        if (HG_Get_output(h, &c->out) == HG_SUCCESS) c->got_output = 1;
    }
    c->done = 1;
    return HG_SUCCESS;
}

static void drive(hg_context_t *a, hg_context_t *b, int *flag) {
    const time_t until = time(NULL) + 15;
    while (!*flag && time(NULL) < until) {
        hg_context_t *cs[2] = {a, b};
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
            out.s = strlen(deferred_in.s) > 1000 ? (char *)deferred_in.s : echo;
            CHECK(HG_Respond(deferred, on_responded, NULL, &out) == HG_SUCCESS, "HG_Respond");
            HG_Free_input(deferred, &deferred_in);
            HG_Destroy(deferred);
            deferred = NULL;
        }
    }
}

int main(int argc, char **argv) {
    const char *info = argc > 1 ? argv[1] : "na+sm";
    CHECK(strcmp(HG_Error_to_string(HG_NOENTRY), "HG_NOENTRY") == 0, "error names");
    unsigned maj = 0, min = 0, pat = 0;
    HG_Version_get(&maj, &min, &pat);
    CHECK(maj == 2 && min == 4 && pat == 1, "version 2.4.1");

    hg_class_t *srv = HG_Init(info, 1);
    if (!srv) {
        fprintf(stderr, "cannot open %s\n", info);
        return 1;
    }
    char client_info[64];
    snprintf(client_info, sizeof client_info, "%s", info);
    char *sep = strstr(client_info, "://");
    if (sep && strncmp(client_info, "inproc", 6) != 0) {
        char *port = strrchr(sep + 3, ':');
        if (port) strcpy(port, ":0");
    }
    hg_class_t *cli = HG_Init(client_info, 0);
    CHECK(cli != NULL, "the client opens");
    if (!cli) return 1;
    CHECK(HG_Class_is_listening(srv) && !HG_Class_is_listening(cli), "who listens");
    hg_context_t *sctx = HG_Context_create(srv), *cctx = HG_Context_create(cli);
    CHECK(sctx && cctx && HG_Context_get_class(sctx) == srv && HG_Context_get_id(cctx) == 0,
          "contexts");

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
    char *name = (char *)malloc(len);
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
    if (c1.got_output) HG_Free_output(h, &c1.out);

    /* 200 kB each way, on the same handle. */
    char *big = (char *)malloc(200001);
    for (int i = 0; i < 200000; ++i) big[i] = (char)('a' + i % 26);
    big[200000] = 0;
    struct call c2 = {0};
    sum_in_t in2 = {1, big};
    CHECK(HG_Forward(h, on_forwarded, &c2, &in2) == HG_SUCCESS, "a 200 kB forward");
    drive(sctx, cctx, &c2.done);
    CHECK(c2.done && c2.ret == HG_SUCCESS && c2.got_output && c2.out.s &&
              strcmp(c2.out.s, big) == 0,
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
    CHECK(handled == 2 && outside == 0, "handlers and callbacks ran in HG_Trigger only");

    /* Teardown. */
    CHECK(HG_Finalize(cli) == HG_BUSY, "HG_Finalize with live objects is HG_BUSY");
    HG_Addr_free(cli, server);
    HG_Addr_free(srv, self);
    /* Run the respond callbacks still queued. */
    for (int i = 0; i < 20; ++i) {
        unsigned n;
        (void)HG_Progress(sctx, 1);
        (void)HG_Trigger(sctx, 0, 16, &n);
    }
    CHECK(HG_Context_destroy(cctx) == HG_SUCCESS && HG_Context_destroy(sctx) == HG_SUCCESS,
          "contexts destroyed");
    CHECK(HG_Finalize(cli) == HG_SUCCESS && HG_Finalize(srv) == HG_SUCCESS, "classes closed");
    free(big);
    free(name);
    if (failures == 0) printf("HG over %s: every check passed\n", info);
    return failures;
}
