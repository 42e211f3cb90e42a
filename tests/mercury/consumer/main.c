/* A program written for Mercury, built against Talaria's install (tests/mercury/consumer.cmake):
 * a server and a client class over na+sm in one process, a procedure generated with
 * MERCURY_GEN_PROC and registered with MERCURY_REGISTER, one call, and the teardown. It uses
 * nothing but Mercury's headers and libraries. */
#include <mercury.h>
#include <mercury_macros.h>
#include <mercury_proc_string.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

MERCURY_GEN_PROC(hello_in_t, ((hg_const_string_t)(who))((int32_t)(n)))
MERCURY_GEN_PROC(hello_out_t, ((int32_t)(n)))

static int done = 0, result = 0;

static hg_return_t hello(hg_handle_t h) {
    hello_in_t in;
    hello_out_t out;
    if (HG_Get_input(h, &in) != HG_SUCCESS) return HG_OTHER_ERROR;
    out.n = in.n + (int32_t)strlen(in.who);
    HG_Respond(h, NULL, NULL, &out);
    HG_Free_input(h, &in);
    HG_Destroy(h);
    return HG_SUCCESS;
}

static hg_return_t answered(const struct hg_cb_info *info) {
    hello_out_t out;
    if (info->ret == HG_SUCCESS && HG_Get_output(info->info.forward.handle, &out) == HG_SUCCESS) {
        result = out.n;
        HG_Free_output(info->info.forward.handle, &out);
    }
    done = 1;
    return HG_SUCCESS;
}

int main(void) {
    hg_class_t *srv = HG_Init("na+sm", HG_TRUE), *cli = HG_Init("na+sm", HG_FALSE);
    if (!srv || !cli) return 1;
    hg_context_t *sctx = HG_Context_create(srv), *cctx = HG_Context_create(cli);
    hg_id_t id = MERCURY_REGISTER(srv, "hello", hello_in_t, hello_out_t, hello);
    MERCURY_REGISTER(cli, "hello", hello_in_t, hello_out_t, NULL);
    hg_addr_t self, server;
    char name[256];
    hg_size_t len = sizeof name;
    HG_Addr_self(srv, &self);
    HG_Addr_to_string(srv, name, &len, self);
    HG_Addr_lookup2(cli, name, &server);
    hg_handle_t h;
    hello_in_t in = {"mercury", 35};
    HG_Create(cctx, server, id, &h);
    HG_Forward(h, answered, NULL, &in);
    for (time_t until = time(NULL) + 10; !done && time(NULL) < until;) {
        unsigned n;
        hg_context_t *cs[2] = {sctx, cctx};
        for (int i = 0; i < 2; ++i) {
            HG_Progress(cs[i], 1);
            HG_Trigger(cs[i], 0, 16, &n);
        }
    }
    HG_Destroy(h);
    HG_Addr_free(cli, server);
    HG_Addr_free(srv, self);
    for (int i = 0; i < 5; ++i) {
        unsigned n;
        HG_Progress(sctx, 1);
        HG_Trigger(sctx, 0, 16, &n);
    }
    HG_Context_destroy(cctx);
    HG_Context_destroy(sctx);
    if (HG_Finalize(cli) != HG_SUCCESS || HG_Finalize(srv) != HG_SUCCESS) return 1;
    printf("hello answered %d (want 42)\n", result);
    return result == 42 ? 0 : 1;
}
