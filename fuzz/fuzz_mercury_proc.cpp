// Fuzz target: Mercury's C procs (src/mercury) decoding arbitrary bytes.
//
// The input is decoded as a record of the types Mercury programs send (integers of every
// width, hg_id_t, two strings, hg_proc_bytes of a length the input names), then the HG_FREE
// pass runs on what was decoded. Decoding may fail (HG_OVERFLOW, HG_PROTOCOL_ERROR) but never
// reads outside the input or allocates more than it holds. When it succeeds, encoding the
// decoded record gives back exactly the bytes it consumed, with each string's two flag bytes
// as the encoder writes them (Mercury's encoding is canonical but for those). Violations abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "mercury_proc.h"
#include "mercury_proc_string.h"
}

namespace {

struct Record {
    uint8_t u8 = 0;
    int16_t i16 = 0;
    uint32_t u32 = 0;
    int64_t i64 = 0;
    hg_id_t id = 0;
    hg_string_t a = nullptr;
    hg_const_string_t b = nullptr;
    uint16_t n = 0;  // bytes of `raw` that follow
    uint8_t raw[512] = {};
};

hg_return_t proc_record(hg_proc_t p, Record& r) {
    hg_return_t ret;
    if ((ret = hg_proc_uint8_t(p, &r.u8)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_int16_t(p, &r.i16)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_uint32_t(p, &r.u32)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_int64_t(p, &r.i64)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_id_t(p, &r.id)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_string_t(p, &r.a)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_const_string_t(p, &r.b)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_uint16_t(p, &r.n)) != HG_SUCCESS) return ret;
    if (r.n > sizeof r.raw) return HG_PROTOCOL_ERROR;  // the program's own bound
    return hg_proc_bytes(p, r.raw, r.n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<uint8_t> in(data, data + size);  // exactly the input: reads past it are caught
    uint8_t none = 0;                            // a buffer for the empty input (NULL is refused)
    hg_proc_t dec = HG_PROC_NULL;
    if (hg_proc_create_set(reinterpret_cast<hg_class_t*>(1), size ? in.data() : &none, size,
                           HG_DECODE, HG_NOHASH, &dec) != HG_SUCCESS)
        std::abort();
    Record r;
    const hg_return_t got = proc_record(dec, r);
    if (got != HG_SUCCESS && got != HG_OVERFLOW && got != HG_PROTOCOL_ERROR) std::abort();
    const hg_size_t used = hg_proc_get_size_used(dec);
    if (used > size) std::abort();
    if (got == HG_SUCCESS) {
        std::vector<uint8_t> out(16);
        hg_proc_t enc = HG_PROC_NULL;
        hg_proc_create_set(reinterpret_cast<hg_class_t*>(1), out.data(), out.size(), HG_ENCODE,
                           HG_NOHASH, &enc);
        if (proc_record(enc, r) != HG_SUCCESS) std::abort();
        if (hg_proc_get_size_used(enc) != used) std::abort();
        const uint8_t* bytes = hg_proc_get_extra_buf(enc)
                                   ? static_cast<const uint8_t*>(hg_proc_get_extra_buf(enc))
                                   : out.data();
        // Compare all but the strings' flag bytes (the encoder writes its own).
        std::vector<uint8_t> want(in.begin(), in.begin() + std::ptrdiff_t(used));
        std::vector<uint8_t> have(bytes, bytes + used);
        std::size_t at = 1 + 2 + 4 + 8 + 4;
        for (const char* s : {static_cast<const char*>(r.a), r.b}) {
            at += 8;
            if (s) {
                at += std::strlen(s) + 1;
                want[at] = have[at] = 0;
                want[at + 1] = have[at + 1] = 0;
                at += 2;
            }
        }
        if (want != have) std::abort();
        hg_proc_free(enc);
    }
    if (hg_proc_reset(dec, nullptr, 0, HG_FREE) != HG_SUCCESS) std::abort();
    (void)proc_record(dec, r);  // frees the decoded strings
    hg_proc_free(dec);
    return 0;
}
