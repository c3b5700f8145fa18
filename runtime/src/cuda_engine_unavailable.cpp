// CudaEngine in a build without CUDA (nvcc was not found at configure time): it reports why it
// cannot run and cannot be constructed.
#include "qf/error.h"
#include "qf/rt/cuda_engine.h"

namespace qf::rt {
namespace {
const char* const kWhy =
    "this qforge was built without CUDA (no nvcc at configure time); rebuild with the CUDA "
    "toolkit, or use --device cpu";
[[noreturn]] void unavailable() {
  throw Error(Errc::kUnsupported, std::string("--device cuda: ") + kWhy);
}
}  // namespace

struct CudaEngine::Impl {};

bool CudaEngine::available(std::string* why) {
  if (why) *why = kWhy;
  return false;
}
CudaEngine::CudaEngine(const Model&, const CudaOptions& options) {
  check_cuda_options(options);
  unavailable();
}
CudaEngine::CudaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
std::unique_ptr<CudaEngine> CudaEngine::synthetic(const ckpt::Qwen35Config&, uint64_t,
                                                  const CudaOptions& options, SyntheticFormat) {
  check_cuda_options(options);
  unavailable();
}
CudaEngine::~CudaEngine() = default;
const ckpt::Qwen35Config& CudaEngine::config() const {
  unavailable();
}
const CudaLoadStats& CudaEngine::load_stats() const {
  unavailable();
}
void CudaEngine::reset() {
  unavailable();
}
int64_t CudaEngine::position() const {
  unavailable();
}
void CudaEngine::snapshot() {
  unavailable();
}
void CudaEngine::restore_snapshot() {
  unavailable();
}
int32_t CudaEngine::step(int32_t, float*) {
  unavailable();
}
int32_t CudaEngine::step_top(int32_t, int, TopLogits&) {
  unavailable();
}
void CudaEngine::verify2_top(const int32_t*, int32_t*, int, TopLogits*) {
  unavailable();
}
int32_t CudaEngine::draft_top(int, int32_t, int, TopLogits&) {
  unavailable();
}
int32_t CudaEngine::step_greedy() {
  unavailable();
}
void CudaEngine::hidden(float*) {
  unavailable();
}
bool CudaEngine::has_mtp() const {
  unavailable();
}
int32_t CudaEngine::mtp_step(int32_t, const float*, float*) {
  unavailable();
}
void CudaEngine::verify2(const int32_t[2], int32_t[2], float*) {
  unavailable();
}
void CudaEngine::advance(std::span<const int32_t>, int32_t*, float*) {
  unavailable();
}
int32_t CudaEngine::prefill(std::span<const int32_t>, float*) {
  unavailable();
}
int32_t CudaEngine::prefill_with_mtp(std::span<const int32_t>, int32_t, float*) {
  unavailable();
}
int32_t CudaEngine::prefill_scored(std::span<const int32_t>, std::span<const int32_t>, int,
                                   TopLogits*, float*, float*) {
  unavailable();
}
int32_t CudaEngine::prefill_scored_with_mtp(std::span<const int32_t>, int32_t,
                                            std::span<const int32_t>, std::span<const int32_t>, int,
                                            TopLogits*, float*, TopLogits*, float*, float*) {
  unavailable();
}
void CudaEngine::reject_last() {
  unavailable();
}
void CudaEngine::verify(std::span<const int32_t>, int32_t*, float*) {
  unavailable();
}
void CudaEngine::reject(int) {
  unavailable();
}
void CudaEngine::mtp_entries(int, std::span<const int32_t>) {
  unavailable();
}
int32_t CudaEngine::draft(int, int32_t, float*) {
  unavailable();
}
int32_t CudaEngine::draft_chain(int32_t, float*) {
  unavailable();
}
void CudaEngine::mtp_rewind(int) {
  unavailable();
}
int64_t CudaEngine::mtp_position() const {
  unavailable();
}
std::vector<KernelShare> CudaEngine::profile_prefill(std::span<const int32_t>) {
  unavailable();
}
std::vector<KernelShare> CudaEngine::profile_step() {
  unavailable();
}
double CudaEngine::time_steps(int) {
  unavailable();
}
double CudaEngine::time_mtp_steps(int) {
  unavailable();
}
double device_copy_bandwidth(uint64_t) {
  unavailable();
}

}  // namespace qf::rt
