// Tokenizer encode throughput on one thread (prints figures; asserts nothing). Only encode is
// timed, after the tokenizer is loaded; bench/tokenizer_bench.py runs this beside Hugging Face
// `tokenizers` on the same documents and checks the ids agree.
//
// Usage: qforge-bench-tokenizer TOKENIZER_JSON DOCS [--runs N] [--ids-out FILE] [--json]
//   DOCS: UTF-8 documents separated by NUL bytes, each encoded on its own.
//   --ids-out: the ids of the last run as little-endian int32, each document's followed by -1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "qf/rt/tokenizer.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string_view> split_docs(const std::string& all) {
  std::vector<std::string_view> docs;
  for (size_t b = 0; b <= all.size();) {
    size_t e = all.find('\0', b);
    if (e == std::string::npos) e = all.size();
    if (e > b) docs.emplace_back(all.data() + b, e - b);
    b = e + 1;
  }
  return docs;
}

void write_ids(const char* path, const std::vector<std::vector<int32_t>>& ids) {
  std::FILE* f = std::fopen(path, "wb");
  if (!f) qf::throw_io("open", path, errno);
  const int32_t end = -1;
  for (const auto& v : ids) {
    std::fwrite(v.data(), sizeof(int32_t), v.size(), f);
    std::fwrite(&end, sizeof end, 1, f);
  }
  if (std::fclose(f) != 0) qf::throw_io("write", path, errno);
}

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: qforge-bench-tokenizer TOKENIZER_JSON DOCS [--runs N] [--ids-out FILE] "
                 "[--json]\n");
    return 1;
  }
  int runs = 5;
  const char* ids_out = nullptr;
  bool json = false;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--ids-out") && i + 1 < argc) {
      ids_out = argv[++i];
    } else if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else {
      std::fprintf(stderr, "qforge-bench-tokenizer: unknown argument '%s'\n", argv[i]);
      return 1;
    }
  }
  double t0 = now();
  const qf::rt::Tokenizer tok = qf::rt::Tokenizer::load(argv[1]);
  const double load_s = now() - t0;
  const std::string all = qf::ckpt::read_text_file(argv[2]);
  const std::vector<std::string_view> docs = split_docs(all);
  size_t n_bytes = 0;
  for (const auto d : docs) n_bytes += d.size();

  std::vector<std::vector<int32_t>> ids(docs.size());
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) {
    t0 = now();
    for (size_t i = 0; i < docs.size(); ++i) ids[i] = tok.encode(docs[i]);
    times.push_back(now() - t0);
  }
  size_t n_tokens = 0;
  for (const auto& v : ids) n_tokens += v.size();
  std::sort(times.begin(), times.end());
  const double best = times.front(), median = times[times.size() / 2];
  if (ids_out) write_ids(ids_out, ids);
  if (json) {
    std::printf(
        "{\"load_s\": %.6f, \"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"runs\": %d, "
        "\"best_s\": %.6f, \"median_s\": %.6f}\n",
        load_s, docs.size(), n_bytes, n_tokens, runs, best, median);
  } else {
    std::printf("load %.3f s; %zu documents, %.2f MB, %zu tokens\n", load_s, docs.size(),
                n_bytes / 1e6, n_tokens);
    std::printf("encode best of %d: %.4f s  %.2f MB/s  %.3f Mtokens/s  (median %.4f s)\n", runs,
                best, n_bytes / best / 1e6, n_tokens / best / 1e6, median);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qforge-bench-tokenizer: error: %s\n", e.what());
    return qf::errc_exit_code(e.code());
  }
}
