// run_tasks: every index once, one worker state per thread, the first error rethrown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "qf/tasks.h"

namespace qf {
namespace {

TEST(RunTasks, EveryIndexOnceWithOneStatePerThread) {
  for (int threads : {0, 1, 3, 64}) {
    SCOPED_TRACE(threads);
    constexpr size_t kN = 1000;
    std::vector<std::atomic<int>> runs(kN);
    std::atomic<int> workers{0};
    run_tasks(kN, threads, [&] {
      ++workers;
      return [&](size_t i) { ++runs[i]; };
    });
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
    EXPECT_GE(workers.load(), 1);
    if (threads > 0) {
      EXPECT_LE(workers.load(), threads);
    }
  }
  bool called = false;
  run_tasks(0, 4, [&] {
    called = true;
    return [](size_t) {};
  });
  EXPECT_FALSE(called);
}

TEST(RunTasks, FirstErrorStopsTheHandOutAndIsRethrown) {
  // Every other task takes 100 us, so running them all would take the other thread 10 s: the
  // hand-out must stop long before that. (With empty tasks it could finish all of them while the
  // throwing thread unwinds on a busy 2-core machine; that made this test flaky.)
  std::atomic<size_t> ran{0};
  EXPECT_THROW(run_tasks(100000, 2,
                         [&] {
                           return [&](size_t i) {
                             ++ran;
                             if (i == 3) throw std::runtime_error("task 3");
                             std::this_thread::sleep_for(std::chrono::microseconds(100));
                           };
                         }),
               std::runtime_error);
  EXPECT_LT(ran.load(), 100000u);
  EXPECT_THROW(
      run_tasks(10, 3,
                []() -> std::function<void(size_t)> { throw std::invalid_argument("no state"); }),
      std::invalid_argument);
}

}  // namespace
}  // namespace qf
