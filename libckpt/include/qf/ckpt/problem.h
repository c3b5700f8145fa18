// A violated rule, as collected by parsers and validators that report every problem.
#pragma once

#include <string>
#include <vector>

#include "qf/error.h"

namespace qf::ckpt {

struct Problem {
  Errc code;
  std::string file;    // file name as shown to the user; empty for checkpoint-wide problems
  std::string tensor;  // tensor name when the problem concerns one tensor
  std::string message;
};

// "<file>: tensor '<name>': <message>" (parts that are empty are left out).
std::string format_problem(const Problem& p);

}  // namespace qf::ckpt
