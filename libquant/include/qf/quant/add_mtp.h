// add-mtp: give a checkpoint back its MTP head (the `mtp.*` tensors speculative decoding needs),
// e.g. after a builder rebuilt the index from the main shards only and dropped the sidecar.
//
// The source's MTP tensors are checked against what the target's config.json expects (names,
// dtypes, shapes; any stored format), then brought over: files that hold only MTP tensors (the
// usual model_extra_tensors.safetensors sidecar) are reflinked, hard linked when asked and
// possible, or copied; MTP tensors mixed into other shards are extracted into a new
// model_extra_tensors.safetensors. Then exactly the mtp.* names are added to the target's index
// (total_size recomputed) and its checksum manifest, if any, is updated. Idempotent: a second
// run adds nothing and says so. Every write is atomic (temporary file + rename).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace qf::quant {

struct AddMtpOptions {
  bool link = false;     // hard link the sidecar when both directories share a filesystem
  bool force = false;    // replace a differing sidecar already in the target
  bool dry_run = false;  // report, change nothing
};

struct AddMtpReport {
  size_t found = 0;                // mtp.* tensors in the source
  size_t added = 0;                // index entries added to the target
  size_t already = 0;              // already listed in the target's index
  std::vector<std::string> files;  // sidecar files in the target
  std::string transfer;            // "reflink", "hardlink", "copy", "extract", "already present"
  uint64_t total_size_before = 0, total_size_after = 0;
  bool manifest_updated = false;
};

// A target whose index already lists a complete MTP head that fits its config (e.g. the FP8
// shared expert build-hybrid put there) is left as is: already = its tensor count, added = 0.
// Throws Error: kTensorNotFound (no MTP in the source), kModelTensorShape/Missing/Unexpected
// (the MTP does not fit the target's config), kExists (a differing sidecar without force),
// kConfigInvalid, kIo.
AddMtpReport add_mtp(const std::filesystem::path& source, const std::filesystem::path& target,
                     const AddMtpOptions& options);

}  // namespace qf::quant
