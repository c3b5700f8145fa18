#include "qf/error.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace qf {
namespace {

struct ErrcInfo {
  Errc code;
  std::string_view name;
  int exit_code;
  std::string_view description;
};

constexpr std::array<ErrcInfo, kNumErrc> kErrcTable = {{
    {Errc::kUsage, "usage", kExitUsage, "bad command-line flags or arguments"},
    {Errc::kHeaderTooSmall, "header-too-small", kExitInvalid, "file shorter than 8 bytes"},
    {Errc::kHeaderTooLarge, "header-too-large", kExitInvalid, "header length above 100 MB"},
    {Errc::kHeaderPastEnd, "header-past-end", kExitInvalid, "header extends past end of file"},
    {Errc::kHeaderNotUtf8, "header-not-utf8", kExitInvalid, "header is not valid UTF-8"},
    {Errc::kHeaderBadJson, "header-bad-json", kExitInvalid, "header is not valid JSON"},
    {Errc::kHeaderNotObject, "header-not-object", kExitInvalid, "header is not a JSON object"},
    {Errc::kTensorBadEntry, "tensor-bad-entry", kExitInvalid, "tensor entry malformed"},
    {Errc::kDuplicateName, "duplicate-name", kExitInvalid, "name appears twice in a header"},
    {Errc::kUnknownDtype, "unknown-dtype", kExitInvalid, "dtype not in the safetensors list"},
    {Errc::kNegativeDim, "negative-dim", kExitInvalid, "negative shape dimension"},
    {Errc::kShapeOverflow, "shape-overflow", kExitInvalid, "element count overflows 64 bits"},
    {Errc::kMisalignedSlice, "misaligned-slice", kExitInvalid, "sub-byte tensor not byte-sized"},
    {Errc::kTensorSizeMismatch, "tensor-size-mismatch", kExitInvalid,
     "byte length != elements x dtype size"},
    {Errc::kBadOffsets, "bad-offsets", kExitInvalid, "data_offsets malformed"},
    {Errc::kOffsetGap, "offset-gap", kExitInvalid, "bytes owned by no tensor"},
    {Errc::kOffsetOverlap, "offset-overlap", kExitInvalid, "two tensors share bytes"},
    {Errc::kOffsetOutOfBounds, "offset-out-of-bounds", kExitInvalid,
     "tensor ends past the end of the file"},
    {Errc::kTrailingBytes, "trailing-bytes", kExitInvalid, "bytes after the last tensor"},
    {Errc::kMetadataNotString, "metadata-not-string", kExitInvalid,
     "__metadata__ is not a string map"},
    {Errc::kIndexInvalid, "index-invalid", kExitInvalid, "index file malformed"},
    {Errc::kIndexMissing, "index-missing", kExitInvalid, "several shards but no index"},
    {Errc::kIndexMissingFile, "index-missing-file", kExitInvalid, "index names a missing file"},
    {Errc::kIndexTensorMissing, "index-tensor-missing", kExitInvalid,
     "index names a tensor its file lacks"},
    {Errc::kIndexTensorUnlisted, "index-tensor-unlisted", kExitInvalid,
     "tensor not listed in the index"},
    {Errc::kIndexWrongFile, "index-wrong-file", kExitInvalid, "index maps tensor to another file"},
    {Errc::kDuplicateAcrossFiles, "duplicate-across-files", kExitInvalid,
     "tensor name in two files"},
    {Errc::kTotalSizeMismatch, "total-size-mismatch", kExitInvalid, "metadata.total_size is wrong"},
    {Errc::kStrayFile, "stray-file", kExitInvalid, ".safetensors file not referenced by index"},
    {Errc::kConfigInvalid, "config-invalid", kExitInvalid, "config file malformed"},
    {Errc::kTensorNotFound, "tensor-not-found", kExitInvalid, "no such tensor"},
    {Errc::kManifestInvalid, "manifest-invalid", kExitInvalid, "checksum manifest malformed"},
    {Errc::kChecksumMismatch, "checksum-mismatch", kExitInvalid, "hash differs from manifest"},
    {Errc::kManifestMissingFile, "manifest-missing-file", kExitInvalid,
     "file in manifest is missing"},
    {Errc::kManifestExtraFile, "manifest-extra-file", kExitInvalid, "file not in manifest"},
    {Errc::kModelTensorMissing, "model-tensor-missing", kExitInvalid,
     "a tensor the config implies is absent"},
    {Errc::kModelTensorUnexpected, "model-tensor-unexpected", kExitInvalid,
     "a tensor the config does not explain"},
    {Errc::kModelTensorShape, "model-tensor-shape", kExitInvalid,
     "dtype or shape differs from the config"},
    {Errc::kQuantConfigMismatch, "quant-config-mismatch", kExitInvalid,
     "quantization_config disagrees with the tensors"},
    {Errc::kQZerosNotSymmetric, "qzeros-not-symmetric", kExitInvalid,
     "symmetric qzeros are not the symmetric constant"},
    {Errc::kNonFiniteValues, "non-finite-values", kExitInvalid, "NaN or Inf in a float tensor"},
    {Errc::kTokenizerInvalid, "tokenizer-invalid", kExitInvalid,
     "tokenizer.json unreadable, malformed or inconsistent"},
    {Errc::kIo, "io", kExitIo, "I/O error"},
    {Errc::kExists, "exists", kExitUsage, "output exists (use --force)"},
    {Errc::kUnsupported, "unsupported", kExitUnsupported, "not supported"},
}};

constexpr bool table_in_order() {
  for (int i = 0; i < kNumErrc; ++i) {
    if (static_cast<int>(kErrcTable[i].code) != i) return false;
  }
  return true;
}
static_assert(table_in_order(), "kErrcTable must follow the Errc declaration order");

const ErrcInfo& info(Errc code) {
  return kErrcTable[static_cast<size_t>(code)];
}

}  // namespace

std::string_view errc_name(Errc code) {
  return info(code).name;
}
int errc_exit_code(Errc code) {
  return info(code).exit_code;
}
std::string_view errc_description(Errc code) {
  return info(code).description;
}

void throw_io(std::string_view what, std::string_view path, int errno_value) {
  std::string msg(what);
  msg += " '";
  msg += path;
  msg += "': ";
  msg += std::strerror(errno_value);
  throw Error(Errc::kIo, msg);
}

void assert_fail(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "qforge: internal error at %s:%d: %s (%s)\n", file, line, msg, expr);
  std::abort();
}

}  // namespace qf
