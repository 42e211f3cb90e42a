// Runs a fuzz target over every file of its seed corpus (directories are walked), so the corpus
// is a regression test under any compiler. Built instead of libFuzzer's main when not fuzzing.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
    namespace fs = std::filesystem;
    std::size_t runs = 0;
    auto run_file = [&](const fs::path& p) {
        std::ifstream in(p, std::ios::binary);
        std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        ++runs;
    };
    for (int i = 1; i < argc; ++i) {
        fs::path arg(argv[i]);
        if (fs::is_directory(arg)) {
            for (const auto& e : fs::recursive_directory_iterator(arg))
                if (e.is_regular_file()) run_file(e.path());
        } else if (fs::exists(arg)) {
            run_file(arg);
        } else {
            std::fprintf(stderr, "no such corpus: %s\n", argv[i]);
            return 2;
        }
    }
    // Empty and tiny inputs always run too.
    LLVMFuzzerTestOneInput(nullptr, 0);
    std::printf("%zu corpus inputs ran without a crash\n", runs);
    return runs > 0 ? 0 : 1;
}
