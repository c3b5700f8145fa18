// A shared work queue for independent tasks on a few threads, with per-thread state.
#pragma once

#include <cstddef>
#include <functional>

namespace qf {

// Runs tasks 0..n-1 on up to `threads` threads (0: hardware concurrency; never more than n), the
// calling thread one of them. Each thread first calls make_worker() for its own state (an engine,
// a buffer) and then calls the function it returns with each index it claims from a shared
// counter, until none is left. The first exception, from make_worker or a task, stops the
// hand-out (the other threads finish their current task) and is rethrown once all have joined.
void run_tasks(size_t n, int threads,
               const std::function<std::function<void(size_t)>()>& make_worker);

}  // namespace qf
