// qforge error model.
//
// Bad user input (files, flags, requests) throws qf::Error carrying a closed error code and a
// message naming the file, tensor, expected and actual value. Internal invariants use
// QF_ASSERT, which aborts with file:line (it is on in release builds too). `main()` maps codes
// to the documented exit codes: 0 ok, 1 usage, 2 invalid input, 3 I/O error, 4 unsupported.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace qf {

// One value per distinct failure. Every validation rule has its own code so tests and `--json`
// consumers can tell them apart. Keep kErrcTable in error.cpp in the same order.
enum class Errc : uint16_t {
  kUsage,  // bad command-line flags or arguments
  // safetensors file structure (the reference reader's rules, plus explicit duplicate checks)
  kHeaderTooSmall,      // file shorter than the 8-byte length prefix
  kHeaderTooLarge,      // header length N above the 100 MB cap
  kHeaderPastEnd,       // 8 + N beyond the end of the file
  kHeaderNotUtf8,       // header bytes are not valid UTF-8
  kHeaderBadJson,       // header is not valid JSON (syntax, trailing bytes such as NUL)
  kHeaderNotObject,     // header JSON is valid but not an object
  kTensorBadEntry,      // a tensor entry lacks a field or has one of the wrong JSON type
  kDuplicateName,       // the same tensor (or metadata) name twice in one header
  kUnknownDtype,        // dtype string not in the safetensors list
  kNegativeDim,         // a negative shape dimension
  kShapeOverflow,       // element count or bit count overflows 64 bits
  kMisalignedSlice,     // sub-byte dtype whose bit count is not a multiple of 8
  kTensorSizeMismatch,  // end - begin != elements x dtype size
  kBadOffsets,          // data_offsets malformed: not two non-negative integers, or begin > end
  kOffsetGap,           // sorted offsets leave bytes no tensor owns
  kOffsetOverlap,       // two tensors claim the same bytes
  kOffsetOutOfBounds,   // a tensor ends past the end of the data section (truncated file)
  kTrailingBytes,       // data section longer than the last tensor's end
  kMetadataNotString,   // __metadata__ is not an object of string values
  // sharded checkpoints
  kIndexInvalid,          // model.safetensors.index.json unreadable or of the wrong shape
  kIndexMissing,          // several .safetensors files but no index
  kIndexMissingFile,      // the index names a file that does not exist
  kIndexTensorMissing,    // the index names a tensor its file does not hold
  kIndexTensorUnlisted,   // a referenced file holds a tensor the index does not list
  kIndexWrongFile,        // the index maps a tensor to a file other than the one holding it
  kDuplicateAcrossFiles,  // the same tensor name in two files of one checkpoint
  kTotalSizeMismatch,     // metadata.total_size differs from the sum of tensor bytes
  kStrayFile,             // a .safetensors file no index entry references
  kConfigInvalid,         // config.json / quantization_config.json unreadable
  kTensorNotFound,        // a lookup for a tensor the checkpoint does not hold
  // checksums
  kManifestInvalid,      // the checksum manifest does not parse
  kChecksumMismatch,     // a file or tensor hash differs from the manifest
  kManifestMissingFile,  // the manifest lists a file that is gone
  kManifestExtraFile,    // a file the manifest does not list
  // model-aware checks (config.json vs tensors)
  kModelTensorMissing,     // a tensor the config implies is absent
  kModelTensorUnexpected,  // a tensor the config does not explain
  kModelTensorShape,       // dtype or shape differs from what the config implies
  kQuantConfigMismatch,    // quantization_config disagrees with how a module is stored
  kQZerosNotSymmetric,     // symmetric GPTQ qzeros that are not the symmetric constant
  kNonFiniteValues,        // NaN or Inf in a float tensor (--scan-values)
  // runtime inputs
  kTokenizerInvalid,  // tokenizer.json unreadable, malformed or inconsistent
  // environment
  kIo,           // read/write/open failed (message carries strerror)
  kExists,       // output exists and --force was not given
  kUnsupported,  // valid input that this version cannot handle
};

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;
inline constexpr int kExitInvalid = 2;
inline constexpr int kExitIo = 3;
inline constexpr int kExitUnsupported = 4;

// Stable kebab-case name ("offset-gap"), used in messages and in --json output.
std::string_view errc_name(Errc code);
// Exit code for a failure of this kind (see the table above).
int errc_exit_code(Errc code);
// One-line description of the rule behind the code (for --help and docs).
std::string_view errc_description(Errc code);
inline constexpr int kNumErrc = static_cast<int>(Errc::kUnsupported) + 1;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

// Throws Error(kIo) with "<what> '<path>': <strerror(errno_value)>".
[[noreturn]] void throw_io(std::string_view what, std::string_view path, int errno_value);

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const char* msg);

}  // namespace qf

// Invariant check, active in every build type. Bad input must never reach one of these.
#define QF_ASSERT(cond, msg) \
  ((cond) ? static_cast<void>(0) : ::qf::assert_fail(#cond, __FILE__, __LINE__, (msg)))
