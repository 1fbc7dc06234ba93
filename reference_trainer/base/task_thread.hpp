// One thread that runs posted tasks in the order they were posted.
//
// FullOffload gives its weight uploads one: queueing a copy on a CUDA stream takes
// the driver's lock, which the autograd thread holds while it launches backward, so
// each call can block the caller for most of a millisecond. On a thread of their
// own those calls no longer hold up the CPU optimizer's next update.
//
// A task that throws does not stop the thread: the exception goes to `on_error`,
// and the tasks after it still run (they may be the ones that report completion).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace primecfg::train {

class TaskThread {
 public:
  using Task = std::function<void()>;

  // `on_start` runs first on the new thread (e.g. to bind it to CPUs).
  explicit TaskThread(std::function<void(std::exception_ptr)> on_error, Task on_start = {})
      : on_error_(std::move(on_error)) {
    thread_ = std::thread([this, start = std::move(on_start)] {
      if (start) run_guarded(start);
      loop();
    });
  }
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  // Runs every task already posted, then joins.
  ~TaskThread() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void post(Task t) {
    {
      std::lock_guard lk(mu_);
      tasks_.push_back(std::move(t));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      Task t;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stop_, and nothing left
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      run_guarded(t);
    }
  }

  void run_guarded(const Task& t) {
    try {
      t();
    } catch (...) {
      on_error_(std::current_exception());
    }
  }

  std::function<void(std::exception_ptr)> on_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace primecfg::train
