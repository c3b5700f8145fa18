#include "qf/ckpt/problem.h"

namespace qf::ckpt {

std::string format_problem(const Problem& p) {
  std::string s;
  if (!p.file.empty()) s += p.file + ": ";
  if (!p.tensor.empty()) s += "tensor '" + p.tensor + "': ";
  return s + p.message;
}

}  // namespace qf::ckpt
