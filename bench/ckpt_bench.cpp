// Checkpoint I/O benchmark: prints figures, asserts nothing (speed targets are not tests).
//
//   1. headers:   `qforge inspect` and `qforge validate` on a 122B-layout INT4 checkpoint
//                 (14 shards + the MTP sidecar, ~113k tensors; zeros, so the shards are sparse).
//   2. checksums: `qforge validate --checksums` against `cat FILES > /dev/null` on the same
//                 files, alternating in one run, page cache warm for both.
//   3. writer:    peak RSS of a child process that streams a 4 GiB safetensors file.
//
// Usage: qforge-bench-ckpt [--dir DIR] [--data-gib N] [--writer-gib N] [--runs N]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "qf/ckpt/writer.h"
#include "qf/quant/synth.h"

namespace {

namespace fs = std::filesystem;
using qf::ckpt::DType;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs argv with stdout/stderr to /dev/null; returns wall seconds (exits on failure).
double run_timed(const std::vector<std::string>& argv) {
  std::fflush(nullptr);  // or the child would print our buffered output again
  const double t0 = now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen("/dev/null", "w", stdout);
    std::freopen("/dev/null", "w", stderr);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double dt = now() - t0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench: '%s' failed (status %d)\n", argv[0].c_str(), status);
    std::exit(1);
  }
  return dt;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string list(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : " ") + std::to_string(x).substr(0, 5);
  return s;
}

void headers(const fs::path& dir, int runs) {
  qf::quant::SynthOptions o;
  o.layout = qf::ckpt::Qwen35Layout::kIntelInt4;
  o.values = qf::quant::SynthValues::kZeros;
  o.shards = 14;
  o.overwrite = true;
  const fs::path ck = dir / "headers-122b-int4";
  const double t0 = now();
  const auto plan = qf::quant::synth_checkpoint(qf::ckpt::qwen35_preset("122b-a10b"), ck, o);
  std::printf(
      "[headers] 122b-a10b intel-int4 (zeros, sparse): %zu tensors in %zu files, "
      "%.2f GiB apparent; synth took %.2f s\n",
      plan.tensors.size(), plan.files.size(), plan.tensor_bytes / 1073741824.0, now() - t0);
  for (const char* cmd : {"inspect", "validate"}) {
    std::vector<double> t;
    for (int i = 0; i < runs; ++i) t.push_back(run_timed({QF_BIN, cmd, ck.string()}));
    std::printf("  qforge %-9s median %.3f s  (runs: %s)\n", cmd, median(t), list(t).c_str());
  }
  std::vector<double> t;
  for (int i = 0; i < runs; ++i)
    t.push_back(run_timed({QF_BIN, "inspect", "--json", "--tensors", ck.string()}));
  std::printf("  qforge inspect --json --tensors  median %.3f s\n", median(t));
}

void checksums(const fs::path& dir, double data_gib, int runs) {
  // Real (random) bytes: a 122B-shaped INT4 prefix of as many layers as fit data_gib.
  qf::quant::SynthOptions o;
  o.layout = qf::ckpt::Qwen35Layout::kIntelInt4;
  o.schema.vision = false;
  o.schema.mtp = false;
  o.shard_bytes = 1ull << 30;
  o.overwrite = true;
  const auto cfg = qf::ckpt::qwen35_preset("122b-a10b");
  for (int64_t l = 1; l <= cfg.num_layers(); ++l) {
    o.schema.layers = l;
    if (qf::quant::plan_synth(cfg, o).tensor_bytes > data_gib * 1073741824.0) break;
  }
  const fs::path ck = dir / "checksums-data";
  qf::quant::synth_checkpoint(cfg, ck, o);
  fs::remove(ck / "qforge-manifest.json");
  std::vector<std::string> cat = {"cat"};
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(ck)) {
    cat.push_back(e.path().string());
    bytes += e.file_size();
  }
  std::sort(cat.begin() + 1, cat.end());
  const std::string out = "/dev/null";
  auto cat_to_null = [&] {
    std::vector<std::string> sh = {"sh", "-c", ""};
    for (const std::string& a : cat) sh[2] += "'" + a + "' ";
    sh[2] += "> /dev/null";
    return run_timed(sh);
  };
  cat_to_null();                                                // warm the page cache
  run_timed({QF_BIN, "validate", "--checksums", ck.string()});  // creates the manifest
  std::printf("[checksums] %.2f GiB in %zu files (page cache warm); qforge verifies the manifest\n",
              bytes / 1073741824.0, cat.size() - 1);
  std::vector<double> ratios;
  for (int i = 0; i < runs; ++i) {
    const double tc = cat_to_null();
    const double tq = run_timed({QF_BIN, "validate", "--checksums", ck.string()});
    ratios.push_back(tc / tq);
    std::printf(
        "  run %d: cat %.3f s (%.2f GB/s)   qforge validate --checksums %.3f s (%.2f GB/s)"
        "   qforge/cat throughput %.2f\n",
        i + 1, tc, bytes / tc / 1e9, tq, bytes / tq / 1e9, tc / tq);
  }
  std::printf("  median throughput ratio qforge/cat: %.2f (target >= 0.80)\n", median(ratios));
}

// The writer runs in a fresh process (exec of this binary), so its peak RSS is its own and not
// pages inherited from the benchmark that forked it.
int writer_child(const fs::path& path, double gib, bool preallocate) {
  const uint64_t total = static_cast<uint64_t>(gib * 1073741824.0);
  const uint64_t per = 256ull << 20;
  std::vector<qf::ckpt::TensorSpec> specs;
  for (uint64_t i = 0; i * per < total; ++i) {
    specs.push_back(
        {"layers." + std::to_string(i) + ".weight", DType::kBF16, {per / 2 / 4096, 4096}});
  }
  qf::ckpt::WriterOptions wo;
  wo.overwrite = true;
  wo.preallocate = preallocate;
  qf::ckpt::SafetensorsWriter w(
      path, qf::ckpt::plan_safetensors(specs, qf::ckpt::Metadata{{"format", "pt"}}), wo);
  std::vector<std::byte> chunk(1 << 20);
  uint64_t k = 0;
  for (uint64_t left = w.plan().data_bytes; left > 0;) {  // a generator: a new byte per chunk
    std::memset(chunk.data(), static_cast<int>(k++ & 0xFF), chunk.size());
    const size_t take = static_cast<size_t>(std::min<uint64_t>(left, chunk.size()));
    w.write(chunk.data(), take);
    left -= take;
  }
  w.commit();
  // Peak RSS of this process image (VmHWM resets at exec, unlike getrusage's ru_maxrss).
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  while (f && std::fgets(line, sizeof line, f)) {
    unsigned long kib = 0;
    if (std::sscanf(line, "VmHWM: %lu kB", &kib) == 1) std::printf("VmHWM %.2f\n", kib / 1024.0);
  }
  if (f) std::fclose(f);
  return 0;
}

void writer_rss(const fs::path& dir, double gib, int runs) {
  const fs::path path = dir / "writer-rss.safetensors";
  const uint64_t bytes = static_cast<uint64_t>(gib * 1073741824.0);
  std::printf(
      "[writer] %.2f GiB safetensors file (256 MiB tensors), fsync'ed; "
      "dd of the same bytes (bs=8M conv=fsync) alongside\n",
      gib);
  for (int i = 0; i < runs; ++i) {
    std::fflush(nullptr);
    const std::string cmd = fs::read_symlink("/proc/self/exe").string() + " --writer-child '" +
                            path.string() + "' " + std::to_string(gib);
    const double t0 = now();
    FILE* child = ::popen(cmd.c_str(), "r");
    double hwm_mib = -1;
    if (!child || std::fscanf(child, "VmHWM %lf", &hwm_mib) != 1 || ::pclose(child) != 0) {
      std::fprintf(stderr, "bench: writer child failed\n");
      std::exit(1);
    }
    const double tw = now() - t0;
    fs::remove(path);
    const double td = run_timed({"dd", "if=/dev/zero", "of=" + path.string(), "bs=8M",
                                 "count=" + std::to_string(bytes >> 23), "conv=fsync"});
    fs::remove(path);
    std::printf(
        "  run %d: qforge writer %.2f s (%.2f GB/s), peak RSS %.1f MiB (target < 64 MiB)"
        "   dd %.2f s (%.2f GB/s)   writer/dd throughput %.2f\n",
        i + 1, tw, bytes / tw / 1e9, hwm_mib, td, bytes / td / 1e9, td / tw);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--writer-child") {
    return writer_child(argv[2], std::stod(argv[3]), true);
  }
  fs::path dir = "build/bench";
  double data_gib = 4, writer_gib = 4;
  int runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--dir")
      dir = argv[i + 1];
    else if (f == "--data-gib")
      data_gib = std::stod(argv[i + 1]);
    else if (f == "--writer-gib")
      writer_gib = std::stod(argv[i + 1]);
    else if (f == "--runs")
      runs = std::stoi(argv[i + 1]);
    else {
      std::fprintf(
          stderr,
          "usage: qforge-bench-ckpt [--dir DIR] [--data-gib N] [--writer-gib N] [--runs N]\n");
      return 1;
    }
  }
  fs::create_directories(dir);
  std::printf("qforge-bench-ckpt: %u cores, work dir %s\n", std::thread::hardware_concurrency(),
              dir.c_str());
  headers(dir, runs);
  checksums(dir, data_gib, runs);
  writer_rss(dir, writer_gib, std::min(runs, 3));
  return 0;
}
