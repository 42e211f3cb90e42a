// Fuzz target: Mercury's bulk-handle proc (src/mercury/bulk.cpp) decoding arbitrary bytes.
//
// The input is decoded as an RPC input holding a bulk handle and a uint32_t, as a handler's
// HG_Get_input would (hg_proc_hg_bulk_t: a size, then HG_Bulk_deserialize's header and
// Talaria's handle encoding), through an HG class on inproc opened once. Decoding may fail
// (HG_OVERFLOW, HG_PROTOCOL_ERROR) but never reads outside the input; a decoded handle states
// the size its header says, is serialized again within the size it reports, and the HG_FREE
// pass frees it (LeakSanitizer sees any handle left behind). Violations abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

extern "C" {
#include "mercury.h"
#include "mercury_bulk.h"
#include "mercury_proc.h"
#include "mercury_proc_bulk.h"
}

namespace {

struct In {
    hg_bulk_t data = HG_BULK_NULL;
    uint32_t n = 0;
};

hg_return_t proc_in(hg_proc_t p, In& in) {
    hg_return_t ret = hg_proc_hg_bulk_t(p, &in.data);
    return ret != HG_SUCCESS ? ret : hg_proc_uint32_t(p, &in.n);
}

hg_class_t* the_class() {
    static hg_class_t* c = HG_Init("inproc://fuzz-mercury-bulk", 1);
    if (!c) std::abort();
    return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    hg_class_t* c = the_class();
    std::vector<uint8_t> bytes(data, data + size);
    uint8_t none = 0;
    hg_proc_t p = HG_PROC_NULL;
    if (hg_proc_create_set(c, size ? bytes.data() : &none, size, HG_DECODE, HG_NOHASH, &p) !=
        HG_SUCCESS)
        std::abort();
    In in;
    const hg_return_t got = proc_in(p, in);
    if (got != HG_SUCCESS && got != HG_OVERFLOW && got != HG_PROTOCOL_ERROR && got != HG_NOMEM)
        std::abort();
    if (in.data != HG_BULK_NULL) {
        const hg_size_t need = HG_Bulk_get_serialize_size(in.data, 0);
        std::vector<uint8_t> again(need ? need : 1);
        if (need && HG_Bulk_serialize(again.data(), need, 0, in.data) != HG_SUCCESS) std::abort();
    }
    hg_proc_reset(p, nullptr, 0, HG_FREE);
    (void)proc_in(p, in);
    if (in.data != HG_BULK_NULL) std::abort();  // the free pass took it
    hg_proc_free(p);
    return 0;
}
