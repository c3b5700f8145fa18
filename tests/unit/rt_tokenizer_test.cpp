#include <gtest/gtest.h>

#include "qf/rt/tokenizer.h"
